"""Redis under faults, end to end through a live gateway: killed and restarted mid-load, slow
replies past the limiter's timeout, and clients that disconnect while their admission is in
flight or mid-stream. Nothing may leak (leases, KV blocks) and no client may see a 5xx."""

from __future__ import annotations

import asyncio
import random
import time
from collections.abc import AsyncIterator
from contextlib import AbstractAsyncContextManager
from pathlib import Path

import aiohttp
import pytest
import redis.asyncio as aioredis

from gateway.ratelimit import FailoverLimiter
from tests.gateway.harness import LiveGateway, live_gateway, make_settings, wait_for
from tests.reliability._redis import DelayProxy, RedisServer


async def chat(gw: LiveGateway, key: str, *, stream: bool = False, max_tokens: int = 2) -> int:
    body = {
        "model": gw.state.model_name,
        "messages": [{"role": "user", "content": "hello there"}],
        "max_tokens": max_tokens,
        "stream": stream,
    }
    url = f"{gw.base_url}/v1/chat/completions"
    async with gw.http.post(url, json=body, headers={"Authorization": f"Bearer {key}"}) as r:
        await r.read()
        return r.status


def redis_gateway(
    database: str, model_dir: Path, var: Path, redis_url: str, *, timeout_s: float
) -> AbstractAsyncContextManager[LiveGateway]:
    """A live gateway limiting through ``redis_url``: a command times out after ``timeout_s``,
    and while failed over Redis is retried every 0.1 s."""
    settings = make_settings(
        database,
        var,
        KVGATE_REDIS_URL=redis_url,
        KVGATE_REDIS_TIMEOUT_S=str(timeout_s),
        KVGATE_REDIS_RETRY_S="0.1",
    )
    return live_gateway(settings, model_dir)


def limiter(gw: LiveGateway) -> FailoverLimiter:
    lim = gw.state.limiter
    assert isinstance(lim, FailoverLimiter)
    return lim


async def leases_in_redis(url: str, tenant: str) -> int:
    client = aioredis.Redis.from_url(url)
    try:
        return int(await client.zcard(f"kvgate:rl:{{{tenant}}}:leases"))
    finally:
        await client.aclose()


def leases_held(gw: LiveGateway) -> int:
    lim = limiter(gw)
    return len(lim.primary.book) + len(lim.fallback.book)


@pytest.fixture
async def delayed(private_redis: RedisServer) -> AsyncIterator[DelayProxy]:
    proxy = DelayProxy(private_redis.port)
    await proxy.start()
    yield proxy
    await proxy.close()


async def _load(gw: LiveGateway, key: str, until: float, statuses: list[int]) -> None:
    i = 0
    while time.monotonic() < until:
        statuses.append(await chat(gw, key, stream=i % 2 == 1))
        i += 1


async def test_redis_killed_and_restarted_mid_load(
    gateway_database: str, demo_model_dir: Path, tmp_path: Path, private_redis: RedisServer
) -> None:
    async with redis_gateway(
        gateway_database, demo_model_dir, tmp_path, private_redis.url, timeout_s=0.2
    ) as gw:
        busy = await gw.create_tenant("busy", limits={"rpm": 100_000, "max_concurrency": 64})
        statuses: list[int] = []
        t0 = time.monotonic()
        load = [asyncio.ensure_future(_load(gw, busy.key, t0 + 3.0, statuses)) for _ in range(6)]
        await asyncio.sleep(0.7)
        private_redis.stop()
        await asyncio.sleep(1.0)
        private_redis.start()
        restarted = time.monotonic()
        await asyncio.gather(*load)
        assert statuses and set(statuses) == {200}, sorted(set(statuses))
        assert limiter(gw).failovers >= 1 and limiter(gw).fallback_decisions > 0

        # Limits exact again within 5 s of the restart: decided by Redis, to the request.
        await wait_for(lambda: not limiter(gw).down, timeout=5.0)
        assert time.monotonic() - restarted < 5.0
        fresh = await gw.create_tenant("fresh", limits={"rpm": 5})
        assert [await chat(gw, fresh.key) for _ in range(7)] == [200] * 5 + [429] * 2
        client = aioredis.Redis.from_url(private_redis.url)
        assert await client.exists(f"kvgate:rl:{{{fresh.id}}}:rpm")
        await client.aclose()
        await wait_for(lambda: leases_held(gw) == 0)
        assert await leases_in_redis(private_redis.url, busy.id) == 0
        limiter(gw).check_integrity()


async def _disconnect(gw: LiveGateway, key: str, rng: random.Random, stream: bool) -> None:
    task = asyncio.ensure_future(chat(gw, key, stream=stream, max_tokens=64))
    await asyncio.sleep(rng.uniform(0.0, 0.2))
    task.cancel()  # the client goes away: before, during or after its admission
    try:
        status = await task
    except (asyncio.CancelledError, aiohttp.ClientError):
        return
    assert status == 200  # finished before the client left


async def test_disconnect_storm_gives_back_every_lease_and_block(
    gateway_database: str, demo_model_dir: Path, tmp_path: Path, delayed: DelayProxy
) -> None:
    async with redis_gateway(
        gateway_database, demo_model_dir, tmp_path, delayed.url, timeout_s=0.25
    ) as gw:
        t = await gw.create_tenant("storm", limits={"max_concurrency": 100, "rpm": 100_000})
        assert await chat(gw, t.key) == 200
        baseline = gw.state.engine.cache_stats().blocks_in_use
        rng = random.Random(7)

        # Every admission waits 60 ms for Redis's answer: many clients leave meanwhile.
        delayed.delay_s = 0.06
        await asyncio.gather(*(_disconnect(gw, t.key, rng, i % 2 == 0) for i in range(40)))
        # Answers later than the limiter's timeout: Redis records leases nobody hears of.
        delayed.delay_s = 0.4
        await asyncio.gather(*(_disconnect(gw, t.key, rng, i % 2 == 0) for i in range(10)))
        delayed.delay_s = 0.0

        await wait_for(lambda: not limiter(gw).down, timeout=5.0)
        await wait_for(lambda: leases_held(gw) == 0, timeout=5.0)
        await wait_for(lambda: gw.state.engine.cache_stats().blocks_in_use == baseline)
        # Exactly zero, long before any lease TTL (30 s) could have expired one.
        deadline = time.monotonic() + 5.0
        while await leases_in_redis(delayed.url, t.id) and time.monotonic() < deadline:
            await asyncio.sleep(0.05)
        assert await leases_in_redis(delayed.url, t.id) == 0
        limiter(gw).check_integrity()
        assert limiter(gw).fallback.active_leases(t.id) == 0
        assert await chat(gw, t.key) == 200
