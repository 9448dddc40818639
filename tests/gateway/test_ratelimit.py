"""Limiter semantics, identical for the Redis script and the in-process twin."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator

import pytest
import redis.asyncio as aioredis

from gateway.ratelimit import Limiter, Limits, MemoryLimiter, RedisLimiter, make_client
from gateway.ratelimit.types import format_duration
from tests.gateway.conftest import SHARED_REDIS_URL


@pytest.fixture(params=["memory", "redis"])
async def limiter(
    request: pytest.FixtureRequest, shared_redis: aioredis.Redis, redis_prefix: str
) -> AsyncIterator[Limiter]:
    if request.param == "memory":
        yield MemoryLimiter()
        return
    lim = RedisLimiter(make_client(SHARED_REDIS_URL, 1.0), redis_prefix)
    yield lim
    await lim.close()


async def test_rpm_burst_is_exact_then_rejects_with_retry(limiter: Limiter) -> None:
    limits = Limits(rpm=5)
    decisions = [await limiter.acquire("t1", limits, 10) for _ in range(6)]
    assert [d.allowed for d in decisions] == [True] * 5 + [False]
    assert [d.requests.remaining for d in decisions[:5]] == [4, 3, 2, 1, 0]
    rejected = decisions[-1]
    assert rejected.reason == "requests" and rejected.lease is None
    # One request per 12 s refills; the next slot opens within 12 s.
    assert 11_000 <= rejected.retry_after_ms <= 12_000
    headers = rejected.headers()
    assert headers["x-ratelimit-limit-requests"] == "5"
    assert headers["x-ratelimit-remaining-requests"] == "0"
    assert headers["Retry-After"] == "12"
    assert "x-ratelimit-limit-tokens" not in headers  # TPM unlimited here
    # Another tenant is unaffected.
    assert (await limiter.acquire("t2", limits, 10)).allowed


async def test_tpm_reserves_then_reconciles(limiter: Limiter) -> None:
    limits = Limits(tpm=1000)
    first = await limiter.acquire("t", limits, 600)
    assert first.allowed and first.tokens.remaining == 400
    second = await limiter.acquire("t", limits, 600)
    assert not second.allowed and second.reason == "tokens"
    assert second.tokens.remaining == 400  # a rejection takes nothing
    await limiter.release(first.lease, used_tokens=100)  # 500 tokens refunded
    third = await limiter.acquire("t", limits, 600)
    assert third.allowed and 298 <= third.tokens.remaining <= 300
    h = third.headers()
    assert h["x-ratelimit-limit-tokens"] == "1000" and h["x-ratelimit-reset-tokens"].endswith("s")


async def test_request_larger_than_tpm_is_never_admissible(limiter: Limiter) -> None:
    d = await limiter.acquire("t", Limits(rpm=10, tpm=100), 101)
    assert not d.allowed and d.reason == "too_large" and d.retry_after_ms == -1
    assert "Retry-After" not in d.headers()
    assert d.requests.remaining == 10  # nothing taken


async def test_concurrency_leases(limiter: Limiter) -> None:
    limits = Limits(max_concurrency=2)
    a = await limiter.acquire("t", limits, 1)
    b = await limiter.acquire("t", limits, 1)
    c = await limiter.acquire("t", limits, 1)
    assert a.allowed and b.allowed and not c.allowed and c.reason == "concurrency"
    assert c.headers()["Retry-After"] == "1"
    await limiter.release(a.lease, 1)
    d = await limiter.acquire("t", limits, 1)
    assert d.allowed
    await limiter.release(b.lease, 1)
    await limiter.release(d.lease, 1)
    if isinstance(limiter, MemoryLimiter):
        limiter.check_integrity()
    assert (
        await limiter.active_leases("t")  # type: ignore[attr-defined]
        if isinstance(limiter, RedisLimiter)
        else limiter.active_leases("t")  # type: ignore[attr-defined]
    ) == 0


async def test_lease_expires_by_ttl() -> None:
    now = [0.0]
    lim = MemoryLimiter(lease_ttl_s=1.0, clock=lambda: now[0])
    limits = Limits(max_concurrency=1)
    assert (await lim.acquire("t", limits, 1)).allowed
    assert not (await lim.acquire("t", limits, 1)).allowed
    now[0] = 1001.0  # the holder crashed without releasing
    assert (await lim.acquire("t", limits, 1)).allowed
    lim.check_integrity()


async def test_gcra_refills_over_time() -> None:
    now = [0.0]
    lim = MemoryLimiter(clock=lambda: now[0])
    limits = Limits(rpm=60)
    assert all([(await lim.acquire("t", limits, 1)).allowed for _ in range(60)])
    assert not (await lim.acquire("t", limits, 1)).allowed
    now[0] = 1000.0  # one second = one request at 60 RPM
    assert (await lim.acquire("t", limits, 1)).allowed
    assert not (await lim.acquire("t", limits, 1)).allowed


async def test_concurrent_acquires_on_redis_are_exact(
    shared_redis: aioredis.Redis, redis_prefix: str
) -> None:
    # Two limiter instances with separate connection pools, racing on the same tenant.
    lims = [RedisLimiter(make_client(SHARED_REDIS_URL, 1.0), redis_prefix) for _ in range(2)]
    limits = Limits(rpm=25, max_concurrency=1000)
    results = await asyncio.gather(*(lims[i % 2].acquire("race", limits, 1) for i in range(60)))
    assert sum(d.allowed for d in results) == 25
    for lim in lims:
        await lim.close()


@pytest.mark.parametrize(
    ("ms", "text"),
    [(0, "0s"), (20, "20ms"), (1500, "1.5s"), (360_000, "6m0s"), (61_250, "1m1.25s")],
)
def test_format_duration(ms: float, text: str) -> None:
    assert format_duration(ms) == text
