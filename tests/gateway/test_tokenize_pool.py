"""TokenizePool: small work inline, large work on its threads, tenants in turn, bounded."""

from __future__ import annotations

import asyncio
import threading
from collections.abc import AsyncIterator, Callable

import pytest

from gateway.errors import ApiError
from gateway.tokenize_pool import INLINE_WORK, NICE, TokenizePool

LARGE = INLINE_WORK + 1


@pytest.fixture
async def pool() -> AsyncIterator[TokenizePool]:
    p = TokenizePool(threads=1, per_tenant=3, total=5)
    yield p
    p.check_integrity()
    p.close()


class Gate:
    """Jobs that record their order and wait until released (on the worker thread)."""

    def __init__(self) -> None:
        self.order: list[str] = []
        self.open = threading.Event()

    def job(self, name: str) -> Callable[[], str]:
        def run() -> str:
            self.open.wait(5.0)
            self.order.append(name)
            return f"{name} on {threading.current_thread().name}"

        return run


async def settle() -> None:
    for _ in range(5):
        await asyncio.sleep(0)


async def test_small_work_runs_inline_large_on_a_worker_thread(pool: TokenizePool) -> None:
    here = threading.current_thread().name
    assert await pool.run("t", INLINE_WORK, lambda: threading.current_thread().name) == here
    name = await pool.run("t", LARGE, lambda: threading.current_thread().name)
    assert name.startswith("kvgate-tokenize")


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
