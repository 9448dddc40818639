"""kvgate inference engine: paged KV cache, prefix reuse, scheduler, model, kernels.

Public names are resolved lazily so that importing a torch-free submodule (``engine.core.kv``,
``engine.core.scheduler``, the boundary the gateway imports) never imports torch; importing the
package changes nothing in the process (the runtime's variables: engine/runtime/__init__.py).
"""

from __future__ import annotations

import importlib
from typing import Any

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
