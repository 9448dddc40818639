"""Graceful shutdown of chat requests: drain until the deadline, then end what still runs.

With ``KVGATE_SHUTDOWN_TIMEOUT_S = T`` and ``grace = min(1 s, T / 5)``::

    SIGTERM ─▶ stop listening ─▶ draining: new requests on open connections get 503
    ─▶ wait for the chat requests in flight ... until T - grace
    ─▶ cut: the handlers still running are cancelled with a shutdown mark; a stream ends with an
       error event (``server_shutdown``) then ``[DONE]``, a non-streaming request answers 503;
       each is recorded as shutdown (status 503), not as a client disconnect (499)
    ─▶ by T: aiohttp closes the connections, the engine and the pools close, the process exits

Only chat requests are tracked: everything else the gateway serves is short and bounded
(database calls by ``KVGATE_DB_TIMEOUT_S``), and aiohttp ends it within ``grace``.
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import Iterator

import structlog

from gateway.errors import ApiError

log = structlog.get_logger(__name__)


def grace_s(timeout_s: float) -> float:
    """Time between cutting the last streams and the shutdown deadline."""
    return min(1.0, timeout_s / 5)


class Drain:
    def __init__(self) -> None:
        self._tasks: set[asyncio.Task[object]] = set()
        self._cut: set[asyncio.Task[object]] = set()  # cancelled by ``run``, not yet handled
        self._idle = asyncio.Event()
        self._idle.set()

    @property
    def in_flight(self) -> int:
        return len(self._tasks)

    @contextlib.contextmanager
    def track(self) -> Iterator[None]:
        """The current task is a chat request until the block exits."""
        task = asyncio.current_task()
        assert task is not None, "track() outside a task"
        self._tasks.add(task)
        self._idle.clear()
        try:
            yield
        finally:
            self._tasks.discard(task)
            self._cut.discard(task)
            if not self._tasks:
                self._idle.set()

    async def run(self, timeout_s: float) -> int:
        """Wait for the tracked requests until ``timeout_s - grace``, then cut the rest and
        give them ``grace`` to answer. Returns how many were cut."""
        started = time.monotonic()
        grace = grace_s(timeout_s)
        with contextlib.suppress(TimeoutError):
            async with asyncio.timeout(max(0.0, timeout_s - grace)):
                await self._idle.wait()
        late = [t for t in self._tasks if not t.done()]
        for task in late:
            self._cut.add(task)
            task.cancel(msg="server shutdown")
        with contextlib.suppress(TimeoutError):
            async with asyncio.timeout(grace):
                await self._idle.wait()
        log.info(
            "drained",
            cut=len(late),
            left=len(self._tasks),
            seconds=round(time.monotonic() - started, 3),
        )
        return len(late)

    def take_cut(self) -> bool:
        """True when the current task's cancellation came from the shutdown cut; the
        cancellation is then consumed, so the handler may still write its last answer."""
        task = asyncio.current_task()
        if task is None or task not in self._cut:
            return False
        self._cut.discard(task)
        task.uncancel()
        return True

    def check_integrity(self) -> None:
        assert self._cut <= self._tasks, "a cut task is no longer tracked"
        assert self._idle.is_set() == (not self._tasks), "idle flag disagrees with the task set"


SHUTDOWN_CODE = "server_shutdown"


def shutdown_error() -> ApiError:
    return ApiError(
        503, "the server is shutting down", type_="service_unavailable", code=SHUTDOWN_CODE
    )
