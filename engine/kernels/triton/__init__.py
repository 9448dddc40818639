"""Triton kernels of the GPU path (also runnable on the CPU under ``TRITON_INTERPRET=1``)."""

from __future__ import annotations

from engine.kernels.triton.cascade import cascade_attention, use_cascade
from engine.kernels.triton.decode import decode_attention
from engine.kernels.triton.prefill import extend_attention
from engine.kernels.triton.store_kv import store_kv

__all__ = [
    "cascade_attention",
    "decode_attention",
    "extend_attention",
    "store_kv",
    "use_cascade",
]
