"""Shared per-tenant load statistics (gateway/cluster/loadstats.py) on the machine's Redis."""

from __future__ import annotations

import redis.asyncio as aioredis

from gateway.cluster.loadstats import BUCKETS, LoadStats
from tests.conftest import SHARED_REDIS_URL


class Clock:
    def __init__(self, now: float) -> None:
        self.now = now

    def __call__(self) -> float:
        return self.now


async def test_gateways_agree_and_settled_buckets_are_read_once(
    shared_redis: aioredis.Redis, redis_prefix: str
) -> None:
    clock = Clock(105.0)  # window 10 s: bucket 10
    a, b = (
        LoadStats(aioredis.Redis.from_url(SHARED_REDIS_URL), redis_prefix, 10.0, clock, 3.0)
        for _ in range(2)
    )
    span = 10.0 * BUCKETS
    try:
        for _ in range(6):
            a.record("t1")
        b.record("t1")
        b.record("t2")
        assert await a.refresh() == {}  # bucket 10 is not complete yet
        clock.now = 111.0  # bucket 10 complete, not settled: gateway b has not flushed yet
        assert await a.refresh() == {"t1": 6 / span}
        assert await b.refresh() == {"t1": 7 / span, "t2": 1 / span}
        clock.now = 114.0  # settled: read once more, then kept
        assert await a.refresh() == {"t1": 7 / span, "t2": 1 / span}
        key = f"{redis_prefix}cluster:load:10"
        await shared_redis.hincrby(key, "t1", 100)  # a write after settling is not read again
        assert await a.refresh() == {"t1": 7 / span, "t2": 1 / span}
        assert (await b.refresh())["t1"] == 107 / span  # b had not kept it: read as it is now
        clock.now = 10.0 * (11 + BUCKETS) + 1  # bucket 10 leaves the averaged windows
        assert await a.refresh() == {}
    finally:
        await a.close()
        await b.close()
