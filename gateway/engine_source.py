"""Where the gateway's engine comes from: chosen by ``create_app`` (no I/O), opened in its
``cleanup_ctx`` (gateway/app.py), held by ``RunningEngine`` while the app runs.

    engine passed in        -> that engine (tests, benchmarks)
    KVGATE_WORKERS set      -> the cluster client over those workers (gateway/cluster/bootstrap.py)
    local_worker (serve)    -> one local worker process, then the cluster client over it
    otherwise               -> the model loaded in this process, on a thread (the event loop runs)

What needs the model at request time (the admin API's system-prompt bound, GET /admin/v1/cluster,
the cluster's metrics) reads it from the ``RunningEngine``: it is set once the engine is open,
before the app serves its first request.
"""

from __future__ import annotations

import asyncio
from dataclasses import dataclass
from typing import Any, Protocol

from engine.errors import EngineClosed
from gateway.settings import ModelSettings, Settings


class EngineSource(Protocol):
    async def open(self) -> Any:
        """The engine, not started yet; raises when it cannot be had (nothing left behind)."""
        ...


@dataclass(frozen=True)
class GivenEngine:
    engine: Any

    async def open(self) -> Any:
        return self.engine


@dataclass(frozen=True)
class InProcessEngine:
    model: ModelSettings
    model_dir: str

    async def open(self) -> Any:
        # Loading reads the checkpoint and may warm up kernels: seconds to minutes off the loop.
        return await asyncio.to_thread(load_engine, self.model, self.model_dir)


def load_engine(model: ModelSettings, model_dir: str) -> Any:
    from engine.async_engine import AsyncEngine  # imports torch: only when a model is loaded

    return AsyncEngine.from_pretrained(model_dir, **model.engine_overrides())


def choose_source(
    settings: Settings, *, engine: Any, model_dir: str | None, local_worker: bool
) -> EngineSource:
    """The source ``create_app`` was asked for; configuration errors raise here, at build."""
    if engine is not None:
        return GivenEngine(engine)
    path = model_dir or settings.model.path
    if settings.cluster.workers or local_worker:
        from gateway.cluster.bootstrap import ClusterSource

        return ClusterSource.from_settings(settings, path)
    if path is None:
        raise ValueError("no model: set KVGATE_MODEL or pass engine/model_dir")
    return InProcessEngine(settings.model, path)


class RunningEngine:
    """The opened engine; empty until ``cleanup_ctx`` opened it (the app serves nothing
    before), kept after it closed (a closed engine answers EngineClosed itself)."""

    def __init__(self) -> None:
        self._engine: Any = None

    def set(self, engine: Any) -> None:
        assert self._engine is None, "the engine was opened twice"
        self._engine = engine

    def get(self) -> Any:
        """The engine, or None before it opened (for readers that may run earlier: metrics)."""
        return self._engine

    @property
    def engine(self) -> Any:
        if self._engine is None:
            raise EngineClosed("the engine is not open yet")
        return self._engine
