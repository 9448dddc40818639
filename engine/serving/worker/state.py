"""``WorkerState``: what the worker's probes and its transport share (one per worker process)."""

from __future__ import annotations

import asyncio
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from aiohttp import web

from engine.remote.messages import WorkerInfo, WorkerLoad
from engine.serving.worker.events import KvEventHub
from engine.serving.worker.load import LoadTracker

if TYPE_CHECKING:
    from engine.serving.async_engine import AsyncEngine


@dataclass
class WorkerState:
    engine: AsyncEngine
    info: WorkerInfo
    events: KvEventHub
    load: LoadTracker
    token: str = field(repr=False, default="")  # what callers present (KVGATE_WORKER_TOKEN)
    background: set[asyncio.Task[Any]] = field(default_factory=set)  # orphan unpins

    def load_report(self) -> WorkerLoad:
        snap = self.load.snapshot()
        return WorkerLoad(
            healthy=bool(self.engine.is_running),
            boot_id=self.info.boot_id,
            running=snap["running"],
            waiting=snap["waiting"],
            outstanding_tokens=snap["outstanding_tokens"],
            served=snap["served"],
            stats=self.engine.cache_stats(),
        )


WORKER = web.AppKey("worker", WorkerState)
