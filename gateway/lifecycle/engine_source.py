"""Where the gateway's engine comes from: chosen by ``create_app`` (no I/O), opened in its
``cleanup_ctx`` (gateway/app.py), held by ``RunningEngine`` while the app runs.

    engine passed in        -> that engine (tests, benchmarks)
    KVGATE_WORKERS set      -> the cluster client over those workers (gateway/cluster/bootstrap.py)
    KVGATE_BACKEND=vllm     -> the cluster client over vLLM servers (gateway/cluster/vllm.py)
    local_worker (serve)    -> one local worker process, then the cluster client over it
    otherwise               -> the model loaded in this process, on a thread (the event loop runs)

What needs the model at request time (the admin API's system-prompt bound, GET /admin/v1/cluster,
the cluster's metrics) reads it from the ``RunningEngine``: it is set once the engine is open,
before the app serves its first request.
"""

from __future__ import annotations

import asyncio
from dataclasses import dataclass
from typing import TYPE_CHECKING, NamedTuple, Protocol

from engine.api import EngineClient
from engine.errors import EngineClosed
from gateway.settings import ModelSettings, Settings

if TYPE_CHECKING:
    from gateway.cluster.bootstrap import ClusterSource
    from gateway.cluster.engine import ClusterEngine
    from gateway.cluster.vllm import VllmSource


class Opened(NamedTuple):
    """An opened engine, not started; ``cluster``: the same engine when it runs in worker
    processes (what the cluster's admin view and metrics read), else None."""

    engine: EngineClient
    cluster: ClusterEngine | None = None


class EngineSource(Protocol):
    async def open(self) -> Opened:
        """The engine, not started yet; raises when it cannot be had (nothing left behind)."""
        ...


@dataclass(frozen=True)
class GivenEngine:
    engine: EngineClient
    cluster: ClusterEngine | None = None

    async def open(self) -> Opened:
        return Opened(self.engine, self.cluster)


@dataclass(frozen=True)
class InProcessEngine:
    model: ModelSettings
    model_dir: str

    async def open(self) -> Opened:
        # Loading reads the checkpoint and may warm up kernels: seconds to minutes off the loop.
        from gateway.cluster.local import load_in_process  # the engine extra: torch

        return Opened(await asyncio.to_thread(load_in_process, self.model, self.model_dir))


@dataclass(frozen=True)
class InWorkers:
    """The cluster client over worker processes (gateway/cluster/bootstrap.py)."""

    source: ClusterSource | VllmSource

    async def open(self) -> Opened:
        cluster = await self.source.open_cluster()
        return Opened(cluster, cluster)


def choose_source(
    settings: Settings,
    *,
    engine: EngineClient | None,
    cluster: ClusterEngine | None,
    model_dir: str | None,
    local_worker: bool,
) -> EngineSource:
    """The source ``create_app`` was asked for; configuration errors raise here, at build."""
    if cluster is not None:
        return GivenEngine(cluster, cluster)
    if engine is not None:
        return GivenEngine(engine)
    path = model_dir or settings.model.path
    if settings.cluster.backend == "vllm":
        from gateway.cluster.vllm import VllmSource

        return InWorkers(VllmSource.from_settings(settings, path))
    if settings.cluster.workers or local_worker:
        from gateway.cluster.bootstrap import ClusterSource

        return InWorkers(ClusterSource.from_settings(settings, path))
    if path is None:
        raise ValueError("no model: set KVGATE_MODEL or pass engine/model_dir")
    return InProcessEngine(settings.model, path)


class RunningEngine:
    """The opened engine; empty until ``cleanup_ctx`` opened it (the app serves nothing
    before), kept after it closed (a closed engine answers EngineClosed itself)."""

    def __init__(self) -> None:
        self._opened: Opened | None = None

    def set(self, opened: Opened) -> None:
        assert self._opened is None, "the engine was opened twice"
        self._opened = opened

    @property
    def engine(self) -> EngineClient:
        if self._opened is None:
            raise EngineClosed("the engine is not open yet")
        return self._opened.engine

    @property
    def cluster(self) -> ClusterEngine | None:
        """The engine when it runs in worker processes; None in this process or before it
        opened (readers that may run earlier: metrics)."""
        return None if self._opened is None else self._opened.cluster
