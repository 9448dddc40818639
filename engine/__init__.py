"""kvgate inference engine: paged KV cache, prefix reuse, scheduler, model, kernels.

Public names are resolved lazily so that importing a torch-free submodule (``engine.core.kv``,
``engine.core.scheduler``) never imports torch.
"""

from __future__ import annotations

import importlib
from typing import Any

from engine.runtime import cpu_isa as _cpu_isa
from engine.runtime import omp_policy as _omp_policy

# Before any torch op runs: KVGATE_CPU_ISA=avx2 also caps torch's and oneDNN's kernels, which
# read their variables at the first CPU kernel (engine/runtime/cpu_isa.py).
_cpu_isa.export_torch_caps()
# Before torch loads libgomp: its threads sleep between ops (engine/runtime/omp_policy.py).
_omp_policy.export()

_EXPORTS = {
    "Engine": "engine.serving.engine",
    "AsyncEngine": "engine.serving.async_engine",
    "CacheScope": "engine.core.kv",
    "EngineConfig": "engine.config",
    "SamplingParams": "engine.params",
}

__all__ = sorted(_EXPORTS)


def __getattr__(name: str) -> Any:
    module = _EXPORTS.get(name)
    if module is None:
        raise AttributeError(f"module 'engine' has no attribute {name!r}")
    return getattr(importlib.import_module(module), name)
