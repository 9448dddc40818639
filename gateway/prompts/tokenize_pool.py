"""Prompt and grammar work off the event loop: small prompts inline, the rest on a few threads.

Rendering and encoding a prompt costs about a microsecond per character (a 1 MiB message: ~1 s
of CPU), and compiling a JSON schema milliseconds to seconds (a 500 KB one: 1.4 s of CPU); on
the event loop that time would stall every other request. So::

    work <= INLINE_WORK characters        on the loop (a few ms at most; no thread hop)
    larger, or a grammar to compile       on ``threads`` worker threads (at least 2); the HF
                                          tokenizer's encode and llguidance's compile release
                                          the GIL, so the loop keeps running

The worker threads run at the lowest CPU priority (``nice`` 19 on Linux, where it is per thread):
large prompts take the CPU the event loop and the engine leave, never the other way round (at
nice 10 another tenant's chat took 1.1-5.7x its unloaded time on a busy 2-core host; at 19,
0.8-1.4x).

Tenants share the threads fairly. A job cannot be pre-empted once a thread runs it (a compile
runs to its end), so two rules::

    threads of one tenant at once   at most ``threads - 1``: another tenant always finds one
    next job                        the first waiting job of the tenant that has used the least
                                    thread time (finished jobs charged their wall time on the
                                    thread, running ones what they have run so far; ties: the
                                    tenant served least recently)

A tenant that starts waiting is lifted to the least time charged to any tenant that is waiting
or running (it banks nothing while idle), and forgotten once it has nothing left in the pool.
So a tenant sending four 500 KB schemas runs them one after another on one thread while another
tenant's prompt takes the other at once: it waits for none of them.

Work is bounded: a tenant with ``limit`` requests waiting here (its concurrency limit, which
the caller passes) gets a 429 for the next one, and ``total`` across tenants answer 503; within
the bound requests wait. Requests of one tenant with the same ``key`` (a grammar's digest) share
one job: ten concurrent requests with one new schema compile it once. Tenants never share a job
(one would wait in the other's queue); two tenants sending one new schema at once compile it
twice at most, and the compile cache keeps one. A job whose every requester went away before
its turn is dropped without running.
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import os
import threading
import time
from collections import deque
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from typing import Any, Generic, NamedTuple, TypeVar

from gateway.errors import ApiError

T = TypeVar("T")

NICE = 19  # added to the worker threads' niceness (capped at 19 by the kernel)
INLINE_WORK = 4096  # characters tokenized on the loop: under ~5 ms even on a slow core
MESSAGE_WORK = 64  # characters one message counts for (its template rendering, its turn tokens)
COMPILE_WORK = INLINE_WORK + 1  # a grammar to compile: never on the loop, whatever its size


def default_threads() -> int:
    """A quarter of the cores, 2 to 4: large prompts are the exception, and the engine, the
    event loop and the rest of the host need the CPUs more; at least two, so that one tenant's
    job (which cannot be pre-empted) never holds every thread."""
    return max(2, min(4, (os.cpu_count() or 1) // 4))


def _lower_priority() -> None:
    with contextlib.suppress(AttributeError, OSError):  # not Linux, or not allowed: as is
        os.setpriority(os.PRIO_PROCESS, threading.get_native_id(), NICE)


def prompt_work(chars: int, messages: int) -> int:
    """The work estimate of rendering and tokenizing a prompt."""
    return chars + MESSAGE_WORK * messages


class TenantWork(NamedTuple):
    """One tenant's share of the pool at a moment."""

    waiting: int  # jobs waiting for a thread
    running: int  # jobs on a thread
    requests: int  # requests waiting for those jobs (several share a keyed job)
    used_s: float  # thread time charged, running jobs' time so far included


@dataclass(eq=False)
class _Job(Generic[T]):
    tenant: str
    fn: Callable[[], T]
    key: str | None
    done: asyncio.Future[T]
    requests: int  # requests waiting for it; 0 once done (they were released)
    started: float | None = None  # the pool's clock when a thread took it


class TokenizePool:
    def __init__(
        self,
        threads: int | None = None,
        per_tenant: int | None = None,
        total: int | None = None,
        *,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.threads = threads or default_threads()
        self.tenant_threads = max(1, self.threads - 1)
        self.per_tenant = per_tenant or 4 * self.threads  # when the caller passes no limit
        self.total = total or 16 * self.per_tenant
        self._clock = clock
        self._executor = ThreadPoolExecutor(
            self.threads, thread_name_prefix="kvgate-tokenize", initializer=_lower_priority
        )
        self._waiting: dict[str, deque[_Job[Any]]] = {}  # tenant -> its jobs not started, in order
        self._keyed: dict[tuple[str, str], _Job[Any]] = {}  # (tenant, key) -> its job not done
        self._running: set[_Job[Any]] = set()
        self._held: dict[str, int] = {}  # tenant -> requests waiting for its jobs
        self._requests = 0  # sum of _held
        self._used: dict[str, float] = {}  # tenant with work here -> thread seconds charged
        self._served: dict[str, int] = {}  # tenant with work here -> its last turn
        self._turns = 0

    async def run(
        self,
        tenant: str,
        work: int,
        fn: Callable[[], T],
        *,
        key: str | None = None,
        limit: int | None = None,
    ) -> T:
        """``fn()`` inline when ``work`` is small, else on a worker thread in the tenant's turn.
        ``key``: requests of the tenant with the same key wait for one job (its result or error
        goes to each). ``limit``: how many of the tenant's requests may wait here at once (its
        concurrency limit; default ``per_tenant``), one more is a 429."""
        if work <= INLINE_WORK:
            return fn()
        self._admit(tenant, self.per_tenant if limit is None else limit)
        job = self._keyed.get((tenant, key)) if key is not None else None
        if job is None:
            job = self._enqueue(tenant, fn, key)
        else:
            self._join(job)
        try:
            return await asyncio.shield(job.done)  # one requester leaving ends no one else's
        except asyncio.CancelledError:
            if not job.done.done():
                self._leave(job)
            raise

    def _admit(self, tenant: str, limit: int) -> None:
        if self._held.get(tenant, 0) >= limit:
            raise ApiError(
                429,
                f"too many large prompts or new grammars of this tenant are waiting to be "
                f"prepared (at most {limit} at a time, its concurrency limit); retry shortly",
                type_="rate_limit_exceeded",
                code="rate_limit_exceeded",
                headers={"Retry-After": "1"},
            )
        if self._requests >= self.total:
            raise ApiError(
                503,
                "the server is busy tokenizing large prompts; retry shortly",
                type_="service_unavailable",
                code="server_busy",
                headers={"Retry-After": "1"},
            )

    def _enqueue(self, tenant: str, fn: Callable[[], T], key: str | None) -> _Job[T]:
        if tenant not in self._used:  # starts waiting: no credit banked while idle
            self._used[tenant] = min(self._used.values(), default=0.0)
            self._held[tenant] = 0
        job = _Job(tenant, fn, key, asyncio.get_running_loop().create_future(), requests=0)
        self._join(job)
        self._waiting.setdefault(tenant, deque()).append(job)
        if key is not None:
            self._keyed[tenant, key] = job
        self._dispatch()
        return job

    def _join(self, job: _Job[Any]) -> None:
        job.requests += 1
        self._held[job.tenant] += 1
        self._requests += 1

    def _dispatch(self) -> None:
        while len(self._running) < self.threads:
            tenant = self._next_tenant()
            if tenant is None:
                return
            queue = self._waiting[tenant]
            job = queue.popleft()
            if not queue:
                del self._waiting[tenant]
            self._turns += 1
            self._served[tenant] = self._turns
            job.started = self._clock()
            self._running.add(job)
            future = asyncio.wrap_future(self._executor.submit(job.fn))
            future.add_done_callback(functools.partial(self._finished, job))

    def _next_tenant(self) -> str | None:
        """The waiting tenant below its thread share that has used the least thread time."""
        now = self._clock()
        ready = [t for t in self._waiting if self._threads_of(t) < self.tenant_threads]
        if not ready:
            return None
        return min(ready, key=lambda t: (self._usage(t, now), self._served.get(t, -1)))

    def _threads_of(self, tenant: str) -> int:
        return sum(1 for job in self._running if job.tenant == tenant)

    def _usage(self, tenant: str, now: float) -> float:
        running = sum(
            now - j.started for j in self._running if j.tenant == tenant and j.started is not None
        )
        return self._used.get(tenant, 0.0) + running

    def _finished(self, job: _Job[Any], future: asyncio.Future[Any]) -> None:
        self._running.discard(job)
        assert job.started is not None
        self._used[job.tenant] += self._clock() - job.started  # charged to whoever asked
        asked = job.requests
        self._release(job)
        if not job.done.done():
            if future.cancelled() or not asked:  # no one left to take its result or error
                job.done.cancel()
            elif (exc := future.exception()) is not None:
                job.done.set_exception(exc)
            else:
                job.done.set_result(future.result())
        self._dispatch()

    def _leave(self, job: _Job[Any]) -> None:
        """One requester went away: the job stays for the others; with none left and no
        thread on it yet, it never runs."""
        job.requests -= 1
        self._held[job.tenant] -= 1
        self._requests -= 1
        if job.requests == 0 and job.started is None:
            queue = self._waiting[job.tenant]
            queue.remove(job)
            if not queue:
                del self._waiting[job.tenant]
            self._release(job)
            job.done.cancel()
        else:
            self._forget_if_idle(job.tenant)

    def _release(self, job: _Job[Any]) -> None:
        """The job leaves the pool: its requesters are released, its key is free again."""
        self._held[job.tenant] -= job.requests
        self._requests -= job.requests
        job.requests = 0
        if job.key is not None and self._keyed.get((job.tenant, job.key)) is job:
            del self._keyed[job.tenant, job.key]
        self._forget_if_idle(job.tenant)

    def _forget_if_idle(self, tenant: str) -> None:
        """Only tenants with work here are remembered (bounded by the requests held)."""
        if self._held[tenant] or tenant in self._waiting or self._threads_of(tenant):
            return
        del self._held[tenant], self._used[tenant]
        self._served.pop(tenant, None)

    def load(self) -> dict[str, TenantWork]:
        """Each tenant with work here: its jobs waiting and running, requests, time used."""
        now = self._clock()
        return {
            t: TenantWork(
                len(self._waiting.get(t, ())), self._threads_of(t), n, self._usage(t, now)
            )
            for t, n in self._held.items()
        }

    def warm(self, fn: Callable[[], Any]) -> asyncio.Future[Any]:
        """Run ``fn`` (a one-time preparation) on a worker thread, outside the tenant queues."""
        return asyncio.wrap_future(self._executor.submit(fn))

    def check_integrity(self) -> None:
        jobs = [j for q in self._waiting.values() for j in q] + list(self._running)
        assert all(self._waiting.values()), "an empty tenant queue is kept"
        assert len(self._running) <= self.threads, f"{len(self._running)} running"
        for tenant in {j.tenant for j in self._running}:
            assert self._threads_of(tenant) <= self.tenant_threads, tenant
        assert all(j.started is None and j.requests > 0 for q in self._waiting.values() for j in q)
        assert all(j.started is not None for j in self._running)
        held: dict[str, int] = {}
        for j in jobs:
            held[j.tenant] = held.get(j.tenant, 0) + j.requests
        assert {t: n for t, n in self._held.items() if n} == {t: n for t, n in held.items() if n}
        assert self._requests == sum(self._held.values()), (self._requests, self._held)
        keyed = {(j.tenant, j.key): j for j in jobs if j.key is not None}
        assert self._keyed == keyed, "keyed jobs are the keyed jobs not done"
        active = {j.tenant for j in jobs} | {t for t, n in self._held.items() if n}
        assert set(self._used) == set(self._held) == active, (self._used, self._held, active)
        assert set(self._served) <= active, "a tenant without work is remembered"

    def close(self) -> None:
        for queue in self._waiting.values():
            for job in queue:
                job.done.cancel()
        self._waiting.clear()
        self._executor.shutdown(wait=False, cancel_futures=True)
