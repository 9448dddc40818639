"""Probes for tests under load: the event loop's lag, a background task for a block, p99."""

from __future__ import annotations

import asyncio
import contextlib
import statistics
import time
from collections.abc import AsyncIterator, Coroutine
from typing import Any

TICK_S = 0.005


class LoopLag:
    """How late a ticker that sleeps ``TICK_S`` wakes up: the lag of the loop it runs on.

    ``lags`` are wall-clock: they include time the machine gave to other processes. ``busy`` is
    the CPU time the loop's own thread spent between two ticks: the loop's own work (callbacks,
    parsing, garbage collection), which other processes on the machine cannot inflate."""

    def __init__(self) -> None:
        self.lags: list[float] = []
        self.busy: list[float] = []

    async def run(self) -> None:
        while True:
            start, cpu = time.perf_counter(), time.thread_time()
            await asyncio.sleep(TICK_S)
            self.lags.append(time.perf_counter() - start - TICK_S)
            self.busy.append(time.thread_time() - cpu)


@contextlib.asynccontextmanager
async def running(coro: Coroutine[Any, Any, Any]) -> AsyncIterator[asyncio.Task[Any]]:
    """``coro`` as a task for the block; cancelled (and awaited) when the block ends."""
    task = asyncio.ensure_future(coro)
    try:
        yield task
    finally:
        task.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await task


def p99(values: list[float]) -> float:
    return statistics.quantiles(values, n=100)[98] if len(values) > 1 else values[0]
