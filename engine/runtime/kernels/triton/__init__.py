"""Triton kernels of the GPU path (also runnable on the CPU under ``TRITON_INTERPRET=1``).

``store_kv`` and ``paged_attention`` have the signatures of ``engine.runtime.kernels`` (the
dispatch point routes CUDA tensors here); the individual kernels are exported for tests and
benchmarks, and the fused ``rms_norm`` / ``rope`` / ``rope_store_kv`` for a model that wants them.
"""

from __future__ import annotations

from engine.runtime.kernels.cascade_rule import use_cascade
from engine.runtime.kernels.triton._common import VARIANTS, check_kv_cache, check_metadata
from engine.runtime.kernels.triton.attention import choose_kernel, paged_attention
from engine.runtime.kernels.triton.cascade import cascade_attention
from engine.runtime.kernels.triton.decode import decode_attention
from engine.runtime.kernels.triton.norm import rms_norm
from engine.runtime.kernels.triton.prefill import extend_attention
from engine.runtime.kernels.triton.rope import rope, rope_store_kv
from engine.runtime.kernels.triton.rope import supports as rope_supports
from engine.runtime.kernels.triton.store_kv import store_kv

__all__ = [
    "VARIANTS",
    "cascade_attention",
    "check_kv_cache",
    "check_metadata",
    "choose_kernel",
    "decode_attention",
    "extend_attention",
    "paged_attention",
    "rms_norm",
    "rope",
    "rope_store_kv",
    "rope_supports",
    "store_kv",
    "use_cascade",
]
