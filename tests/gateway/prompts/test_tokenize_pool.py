"""TokenizePool: small work inline, large work on its threads, tenants served by the thread time
they used, no tenant on every thread, requests with one key sharing a job, bounded."""

from __future__ import annotations

import asyncio
import threading
from collections.abc import AsyncIterator, Callable

import pytest

from gateway.errors import ApiError
from gateway.prompts.tokenize_pool import (
    COMPILE_WORK,
    INLINE_WORK,
    NICE,
    TokenizePool,
    default_threads,
)
from tests.gateway.harness import wait_for

LARGE = INLINE_WORK + 1


@pytest.fixture
async def pool() -> AsyncIterator[TokenizePool]:
    p = TokenizePool(threads=1, per_tenant=3, total=5)
    yield p
    p.check_integrity()
    p.close()


class Clock:
    """The pool's clock, set by the test: thread time charged is exactly what the test says."""

    def __init__(self) -> None:
        self.now = 0.0

    def __call__(self) -> float:
        return self.now


class Gate:
    """Jobs that record their order and wait until released (on the worker thread): all at
    once (``open``), or one by one (``release``)."""

    def __init__(self) -> None:
        self.order: list[str] = []
        self.started: list[str] = []
        self.open = threading.Event()
        self._each: dict[str, threading.Event] = {}

    def job(self, name: str) -> Callable[[], str]:
        own = self._each.setdefault(name, threading.Event())

        def run() -> str:
            self.started.append(name)
            while not (self.open.is_set() or own.is_set()):
                own.wait(0.01)
            self.order.append(name)
            return f"{name} on {threading.current_thread().name}"

        return run

    async def release(self, name: str) -> None:
        self._each[name].set()
        await wait_for(lambda: name in self.order)


async def settle() -> None:
    for _ in range(5):
        await asyncio.sleep(0)


def test_two_threads_at_least_so_one_tenant_never_holds_them_all() -> None:
    assert default_threads() >= 2
    assert TokenizePool(threads=2).tenant_threads == 1
    assert TokenizePool(threads=4).tenant_threads == 3


async def test_small_work_runs_inline_large_on_a_worker_thread(pool: TokenizePool) -> None:
    here = threading.current_thread().name
    assert await pool.run("t", INLINE_WORK, lambda: threading.current_thread().name) == here
    name = await pool.run("t", LARGE, lambda: threading.current_thread().name)
    assert name.startswith("kvgate-tokenize")
    assert COMPILE_WORK > INLINE_WORK  # a grammar compile always goes to the threads


async def test_worker_threads_run_at_a_lower_priority(pool: TokenizePool) -> None:
    import os

    def niceness() -> int:
        return os.getpriority(os.PRIO_PROCESS, threading.get_native_id())

    here = niceness()
    assert await pool.run("t", LARGE, niceness) == min(19, here + NICE)


async def test_tenants_take_turns(pool: TokenizePool) -> None:
    gate = Gate()
    tasks = [asyncio.create_task(pool.run("a", LARGE, gate.job(f"a{i}"))) for i in range(3)]
    await settle()
    tasks.append(asyncio.create_task(pool.run("b", LARGE, gate.job("b0"))))
    await settle()
    pool.check_integrity()
    gate.open.set()
    results = await asyncio.gather(*tasks)
    # a0 was running when b0 came; b0 is next, before a's other waiting jobs.
    assert gate.order == ["a0", "b0", "a1", "a2"]
    assert all("kvgate-tokenize" in r for r in results)


async def test_a_tenant_never_takes_the_last_thread() -> None:
    """Four long jobs of one tenant (a compile cannot be pre-empted) run one at a time on one
    thread; another tenant's job takes the other thread at once and ends before any of them."""
    pool = TokenizePool(threads=2)
    gate = Gate()
    heavy = [asyncio.create_task(pool.run("a", COMPILE_WORK, gate.job(f"a{i}"))) for i in range(4)]
    await settle()
    b = asyncio.create_task(pool.run("b", LARGE, gate.job("b0")))
    await wait_for(lambda: "b0" in gate.started)
    load = pool.load()
    assert (load["a"].running, load["a"].waiting, load["a"].requests) == (1, 3, 4)
    assert (load["b"].running, load["b"].waiting) == (1, 0)
    pool.check_integrity()
    await gate.release("b0")
    assert (await b).startswith("b0")
    assert gate.order == ["b0"]  # none of a's jobs ended, or had to, before b's
    gate.open.set()
    await asyncio.gather(*heavy)
    assert gate.order == ["b0", "a0", "a1", "a2", "a3"]
    pool.check_integrity()
    pool.close()


async def test_the_tenant_that_used_less_thread_time_goes_first() -> None:
    """Turns follow the thread time used, not who was served last: c, served more recently than
    b but for one second against b's five, goes again before b."""
    clock = Clock()
    pool = TokenizePool(threads=2, clock=clock)
    gate = Gate()
    run = {n: asyncio.create_task(pool.run(n[0], LARGE, gate.job(n))) for n in ("a0", "b0")}
    await wait_for(lambda: len(gate.started) == 2)
    for name in ("c0", "c1", "b1"):
        run[name] = asyncio.create_task(pool.run(name[0], LARGE, gate.job(name)))
    await settle()
    assert pool.load()["c"].used_s == 0.0  # arrived when nothing was charged yet
    clock.now = 5.0
    await gate.release("b0")  # b: 5 s; c (0 s) goes next
    await wait_for(lambda: "c0" in gate.started)
    clock.now = 6.0
    await gate.release("c0")  # c: 1 s, served after b, still behind b's 5 s
    await wait_for(lambda: len(gate.started) == 4)
    assert gate.started == ["a0", "b0", "c0", "c1"] or gate.started == ["b0", "a0", "c0", "c1"]
    load = pool.load()
    assert load["b"].used_s == 5.0 and load["c"].used_s == 1.0
    assert load["a"].used_s == 6.0  # a0 still running: its time so far counts
    pool.check_integrity()
    gate.open.set()
    await asyncio.gather(*run.values())
    pool.close()


async def test_a_tenant_that_comes_back_banks_no_credit() -> None:
    clock = Clock()
    pool = TokenizePool(threads=2, clock=clock)
    gate = Gate()
    a0 = asyncio.create_task(pool.run("a", LARGE, gate.job("a0")))
    a1 = asyncio.create_task(pool.run("a", LARGE, gate.job("a1")))
    await wait_for(lambda: gate.started == ["a0"])
    clock.now = 10.0
    await gate.release("a0")  # a: 10 s, a1 runs
    b0 = asyncio.create_task(pool.run("b", LARGE, gate.job("b0")))
    await settle()
    assert pool.load()["b"].used_s == 10.0  # the least any tenant with work has been charged
    gate.open.set()
    await asyncio.gather(a0, a1, b0)
    assert pool.load() == {}  # tenants without work are forgotten
    pool.check_integrity()
    pool.close()


async def test_requests_with_one_key_share_one_job() -> None:
    pool = TokenizePool(threads=2)
    calls: list[int] = []
    release = threading.Event()

    def compile_once() -> str:
        calls.append(1)
        release.wait(5.0)
        return "compiled"

    tasks = [
        asyncio.create_task(pool.run("a", COMPILE_WORK, compile_once, key="d1", limit=10))
        for _ in range(10)
    ]
    await settle()
    load = pool.load()["a"]
    assert (load.waiting, load.running, load.requests) == (0, 1, 10)  # one job, ten requests
    pool.check_integrity()
    tasks[0].cancel()  # one requester leaves: the others still get the job's result
    await settle()
    pool.check_integrity()
    release.set()
    assert await asyncio.gather(*tasks[1:]) == ["compiled"] * 9
    assert calls == [1]
    other_key = await pool.run("a", COMPILE_WORK, lambda: "again", key="d2")
    assert other_key == "again"
    pool.check_integrity()
    pool.close()


async def test_a_shared_job_whose_requesters_all_left_never_runs(pool: TokenizePool) -> None:
    gate = Gate()
    first = asyncio.create_task(pool.run("a", LARGE, gate.job("a0")))
    shared = [
        asyncio.create_task(pool.run("a", COMPILE_WORK, gate.job("k"), key="k")) for _ in range(2)
    ]
    await settle()
    for task in shared:
        task.cancel()
    await settle()
    pool.check_integrity()
    gate.open.set()
    await first
    assert gate.order == ["a0"]
    assert pool.load() == {}


async def test_a_tenant_waits_within_its_limit_and_gets_429_beyond(pool: TokenizePool) -> None:
    gate = Gate()
    held = [asyncio.create_task(pool.run("a", LARGE, gate.job(f"a{i}"), limit=6)) for i in range(5)]
    await settle()
    assert pool.load()["a"].requests == 5  # more than per_tenant (3): its own limit counts
    with pytest.raises(ApiError) as err:
        await pool.run("a", LARGE, gate.job("a5"), limit=5)
    assert err.value.status == 429 and err.value.headers["Retry-After"] == "1"
    assert "at most 5" in err.value.message
    with pytest.raises(ApiError) as err:  # the total bound (5) holds whatever the limit
        await pool.run("b", LARGE, gate.job("b0"), limit=100)
    assert err.value.status == 503 and err.value.code == "server_busy"
    gate.open.set()
    await asyncio.gather(*held)
    assert gate.order == [f"a{i}" for i in range(5)]


async def test_a_tenant_over_its_share_gets_429_and_everyone_over_the_total_503(
    pool: TokenizePool,
) -> None:
    gate = Gate()
    held = [asyncio.create_task(pool.run("a", LARGE, gate.job(f"a{i}"))) for i in range(3)]
    await settle()
    with pytest.raises(ApiError) as err:
        await pool.run("a", LARGE, gate.job("a3"))
    assert err.value.status == 429 and err.value.headers["Retry-After"] == "1"
    assert await pool.run("a", INLINE_WORK, lambda: "small") == "small"  # never queued
    held += [asyncio.create_task(pool.run("b", LARGE, gate.job(f"b{i}"))) for i in range(2)]
    await settle()
    with pytest.raises(ApiError) as err:
        await pool.run("c", LARGE, gate.job("c0"))
    assert err.value.status == 503 and err.value.code == "server_busy"
    gate.open.set()
    await asyncio.gather(*held)
    assert sorted(gate.order) == ["a0", "a1", "a2", "b0", "b1"]


async def test_a_job_whose_client_left_before_its_turn_never_runs(pool: TokenizePool) -> None:
    gate = Gate()
    first = asyncio.create_task(pool.run("a", LARGE, gate.job("a0")))
    second = asyncio.create_task(pool.run("a", LARGE, gate.job("a1")))
    await settle()
    second.cancel()
    await settle()
    pool.check_integrity()
    gate.open.set()
    await first
    with pytest.raises(asyncio.CancelledError):
        await second
    assert gate.order == ["a0"]


async def test_errors_reach_the_caller_and_free_the_slot(pool: TokenizePool) -> None:
    def fail() -> None:
        raise ApiError(400, "too long", code="context_length_exceeded")

    for _ in range(5):  # more than per_tenant: each failure gave its slot back
        with pytest.raises(ApiError) as err:
            await pool.run("a", LARGE, fail)
        assert err.value.code == "context_length_exceeded"
    for _ in range(2):  # a shared job's error reaches each of its requesters
        results = await asyncio.gather(
            *(pool.run("a", COMPILE_WORK, fail, key="bad") for _ in range(3)),
            return_exceptions=True,
        )
        assert all(isinstance(r, ApiError) for r in results)


async def test_a_running_job_whose_requesters_left_keeps_its_thread_until_it_ends(
    pool: TokenizePool,
) -> None:
    """A job on a thread cannot be stopped: it still holds the thread and its tenant's share,
    and its time is still charged, until it ends."""
    gate = Gate()
    task = asyncio.create_task(pool.run("a", LARGE, gate.job("a0")))
    await wait_for(lambda: gate.started == ["a0"])
    task.cancel()
    await settle()
    load = pool.load()["a"]
    assert (load.running, load.requests) == (1, 0)
    pool.check_integrity()
    await gate.release("a0")
    await wait_for(lambda: pool.load() == {})
    with pytest.raises(asyncio.CancelledError):
        await task
