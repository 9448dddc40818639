"""Prompt tokenization off the event loop: small prompts inline, large ones on a few threads.

Rendering and encoding a prompt costs about a microsecond per character (a 1 MiB message: ~1 s
of CPU), and on the event loop that time would stall every other request. So::

    work <= INLINE_WORK characters        on the loop (a few ms at most; no thread hop)
    larger, or a grammar to compile       on ``threads`` worker threads; the HF tokenizer's
                                          encode releases the GIL, so the loop keeps running

The worker threads run at the lowest CPU priority (``nice`` 19 on Linux, where it is per thread):
large prompts take the CPU the event loop and the engine leave, never the other way round (at
nice 10 another tenant's chat took 1.1-5.7x its unloaded time on a busy 2-core host; at 19,
0.8-1.4x).

Tenants take turns: each tenant waits in its own queue and the next free thread takes the first
job of the waiting tenant served least recently, so a tenant sending many large prompts delays
another tenant's large prompt by at most one job per thread, and small prompts not at all. Work
is bounded: a tenant with ``per_tenant`` jobs waiting or running gets a 429 for the next one, and
``total`` such jobs across tenants answer 503; a job whose client went away before its turn is
dropped without running.
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import os
import threading
from collections import deque
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import Any, Generic, TypeVar

from gateway.errors import ApiError

T = TypeVar("T")

NICE = 19  # added to the worker threads' niceness (capped at 19 by the kernel)
INLINE_WORK = 4096  # characters tokenized on the loop: under ~5 ms even on a slow core
MESSAGE_WORK = 64  # characters one message counts for (its template rendering, its turn tokens)


def default_threads() -> int:
    """A quarter of the cores, 1 to 4: large prompts are the exception, and the engine, the
    event loop and the rest of the host need the CPUs more."""
    return max(1, min(4, (os.cpu_count() or 1) // 4))


def _lower_priority() -> None:
    with contextlib.suppress(AttributeError, OSError):  # not Linux, or not allowed: as is
        os.setpriority(os.PRIO_PROCESS, threading.get_native_id(), NICE)


def prompt_work(chars: int, messages: int, *, grammar: bool = False) -> int:
    """The work estimate of a prompt; one with a grammar to compile always goes to the threads
    (compiling a schema takes milliseconds to seconds, whatever the prompt's size)."""
    work = chars + MESSAGE_WORK * messages
    return max(work, INLINE_WORK + 1) if grammar else work


@dataclass(eq=False)
class _Job(Generic[T]):
    fn: Callable[[], T]
    done: asyncio.Future[T] = field(
        default_factory=lambda: asyncio.get_running_loop().create_future()
    )
    started: bool = False


class TokenizePool:
    def __init__(
        self, threads: int | None = None, per_tenant: int | None = None, total: int | None = None
    ) -> None:
        self.threads = threads or default_threads()
        self.per_tenant = per_tenant or 4 * self.threads
        self.total = total or 16 * self.per_tenant
        self._executor = ThreadPoolExecutor(
            self.threads, thread_name_prefix="kvgate-tokenize", initializer=_lower_priority
        )
        self._waiting: dict[str, deque[_Job[Any]]] = {}  # tenant -> its jobs not started, in order
        self._held: dict[str, int] = {}  # tenant -> jobs waiting or running
        self._served: dict[str, int] = {}  # tenant (with jobs held) -> when it last had a turn
        self._turns = 0
        self._running = 0

    async def run(self, tenant: str, work: int, fn: Callable[[], T]) -> T:
        """``fn()`` inline when ``work`` is small, else on a worker thread in the tenant's turn."""
        if work <= INLINE_WORK:
            return fn()
        self._admit(tenant)
        job = _Job(fn)
        self._held[tenant] = self._held.get(tenant, 0) + 1
        self._waiting.setdefault(tenant, deque()).append(job)
        self._dispatch()
        try:
            return await job.done
        except asyncio.CancelledError:
            if not job.started:  # the client left before its turn: never run it
                self._withdraw(tenant, job)
            raise

    def _admit(self, tenant: str) -> None:
        if self._held.get(tenant, 0) >= self.per_tenant:
            raise ApiError(
                429,
                f"too many large prompts of this tenant are being tokenized (at most "
                f"{self.per_tenant} at a time); retry shortly",
                type_="rate_limit_exceeded",
                code="rate_limit_exceeded",
                headers={"Retry-After": "1"},
            )
        if sum(self._held.values()) >= self.total:
            raise ApiError(
                503,
                "the server is busy tokenizing large prompts; retry shortly",
                type_="service_unavailable",
                code="server_busy",
                headers={"Retry-After": "1"},
            )

    def _dispatch(self) -> None:
        while self._running < self.threads and self._waiting:
            tenant = min(self._waiting, key=lambda t: self._served.get(t, -1))
            queue = self._waiting[tenant]
            job = queue.popleft()
            if not queue:
                del self._waiting[tenant]
            self._turns += 1
            self._served[tenant] = self._turns
            job.started = True
            self._running += 1
            future = asyncio.wrap_future(self._executor.submit(job.fn))
            future.add_done_callback(functools.partial(self._finished, tenant, job))

    def _finished(self, tenant: str, job: _Job[Any], future: asyncio.Future[Any]) -> None:
        self._running -= 1
        self._release(tenant)
        exc = None if future.cancelled() else future.exception()
        if not job.done.done():
            if future.cancelled():
                job.done.cancel()
            elif exc is not None:
                job.done.set_exception(exc)
            else:
                job.done.set_result(future.result())
        self._dispatch()

    def _withdraw(self, tenant: str, job: _Job[Any]) -> None:
        queue = self._waiting.get(tenant)
        if queue is not None:
            with contextlib.suppress(ValueError):
                queue.remove(job)
            if not queue:
                del self._waiting[tenant]
        self._release(tenant)

    def _release(self, tenant: str) -> None:
        left = self._held[tenant] - 1
        if left:
            self._held[tenant] = left
        else:
            del self._held[tenant]
            self._served.pop(tenant, None)  # only tenants with jobs are remembered

    def warm(self, fn: Callable[[], Any]) -> asyncio.Future[Any]:
        """Run ``fn`` (a one-time preparation) on a worker thread, outside the tenant queues."""
        return asyncio.wrap_future(self._executor.submit(fn))

    def check_integrity(self) -> None:
        waiting = sum(len(q) for q in self._waiting.values())
        assert all(self._waiting.values()), "an empty tenant queue is kept"
        assert 0 <= self._running <= self.threads, f"{self._running} running"
        assert sum(self._held.values()) == waiting + self._running, (self._held, waiting)
        assert all(n > 0 for n in self._held.values()), self._held
        assert set(self._served) <= set(self._held), "a tenant without jobs is remembered"

    def close(self) -> None:
        for queue in self._waiting.values():
            for job in queue:
                job.done.cancel()
        self._waiting.clear()
        self._executor.shutdown(wait=False, cancel_futures=True)
