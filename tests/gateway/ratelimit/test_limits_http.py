"""Rate limits at the HTTP surface: headers on every response, 429s, Redis outages."""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import Any

import openai
import redis.asyncio as aioredis

from tests.gateway.harness import LiveGateway, live_gateway, make_settings, wait_for
from tests.gateway.redis_server import RedisServer

HEADERS = ("limit", "remaining", "reset")


async def chat(gw: LiveGateway, key: str, **extra: Any) -> tuple[int, dict[str, str], Any]:
    body = {
        "model": gw.state.model_name,
        "messages": [{"role": "user", "content": "hi"}],
        "max_tokens": 2,
        **extra,
    }
    url = f"{gw.base_url}/v1/chat/completions"
    async with gw.http.post(url, json=body, headers={"Authorization": f"Bearer {key}"}) as r:
        return r.status, dict(r.headers), await r.json()


async def check_rpm_limit(gw: LiveGateway) -> None:
    t = await gw.create_tenant("rpm", limits={"rpm": 3, "tpm": 100_000})
    remaining = []
    for _ in range(3):
        status, headers, _ = await chat(gw, t.key)
        assert status == 200
        for h in HEADERS:
            assert f"x-ratelimit-{h}-requests" in headers and f"x-ratelimit-{h}-tokens" in headers
        assert headers["x-ratelimit-limit-requests"] == "3"
        assert headers["x-ratelimit-limit-tokens"] == "100000"
        remaining.append(int(headers["x-ratelimit-remaining-requests"]))
    assert remaining == [2, 1, 0]
    status, headers, body = await chat(gw, t.key)
    assert status == 429
    assert body["error"]["type"] == "rate_limit_exceeded"
    assert 1 <= int(headers["Retry-After"]) <= 20
    assert headers["x-ratelimit-remaining-requests"] == "0"
    with_client = gw.openai(t.key)
    try:
        await with_client.chat.completions.create(
            model=gw.state.model_name, messages=[{"role": "user", "content": "x"}], max_tokens=1
        )
    except openai.RateLimitError as exc:
        assert exc.response.headers["retry-after"]
    else:
        raise AssertionError("expected a 429")
    metrics = await (await gw.http.get(gw.metrics_url)).text()
    labels = f'reason="requests",scope="tenant",tenant="{t.id}"'
    assert f"kvgate_ratelimit_rejections_total{{{labels}}} 2.0" in metrics


async def test_rpm_limit_in_process(
    gateway_database: str, demo_model_dir: Path, tmp_path: Path
) -> None:
    async with live_gateway(make_settings(gateway_database, tmp_path), demo_model_dir) as gw:
        await check_rpm_limit(gw)


async def test_rpm_limit_and_tpm_reconcile_with_redis(
    gateway_database: str,
    demo_model_dir: Path,
    tmp_path: Path,
    shared_redis: aioredis.Redis,
    redis_prefix: str,
) -> None:
    settings = make_settings(
        gateway_database,
        tmp_path,
        KVGATE_REDIS_URL="redis://127.0.0.1:6379/0",
        KVGATE_REDIS_PREFIX=redis_prefix,
    )
    async with live_gateway(settings, demo_model_dir) as gw:
        await check_rpm_limit(gw)
        assert [k async for k in shared_redis.scan_iter(match=f"{redis_prefix}rl:*")]
        t = await gw.create_tenant("tpm", limits={"tpm": 60_000, "max_output_tokens": 2000})
        # A stop string ends the answer early: the unused 2000-token reservation is refunded.
        status, _, body = await chat(gw, t.key, max_tokens=2000, stop=["\n", " ", "a", "e"])
        assert status == 200
        used = body["usage"]["total_tokens"]
        reserved = body["usage"]["prompt_tokens"] + 2000
        assert used < reserved - 1000
        status, h2, _ = await chat(gw, t.key, max_tokens=2000, stop=["\n", " ", "a", "e"])
        # remaining after the 2nd admission = limit - used(1st) - reserved(2nd) (+ refill).
        expected = 60_000 - used - reserved
        assert expected <= int(h2["x-ratelimit-remaining-tokens"]) <= expected + 500


async def test_redis_outage_fails_open_and_recovers(
    gateway_database: str, demo_model_dir: Path, tmp_path: Path, private_redis: RedisServer
) -> None:
    settings = make_settings(
        gateway_database,
        tmp_path,
        KVGATE_REDIS_URL=private_redis.url,
        KVGATE_REDIS_RETRY_S="0.05",
        KVGATE_REDIS_TIMEOUT_S="0.2",
    )
    async with live_gateway(settings, demo_model_dir) as gw:
        t = await gw.create_tenant("outage", limits={"rpm": 1000})
        limiter = gw.state.limiter
        assert (await chat(gw, t.key))[0] == 200
        private_redis.stop()
        status, headers, _ = await chat(gw, t.key)
        assert status == 200 and "x-ratelimit-remaining-requests" in headers
        assert limiter.down and limiter.failovers == 1
        async with gw.http.get(f"{gw.base_url}/readyz") as r:  # fail open: degraded, ready
            assert r.status == 200 and (await r.json())["redis"] == "degraded"
        metrics = await (await gw.http.get(gw.metrics_url)).text()
        assert "kvgate_ratelimit_redis_down 1.0" in metrics
        assert "kvgate_ratelimit_fallback_decisions_total 1.0" in metrics

        private_redis.start()
        await wait_for(lambda: not limiter.down)
        assert (await chat(gw, t.key))[0] == 200
        assert limiter.fallback_decisions == 1  # decided by Redis again
        client = aioredis.Redis.from_url(private_redis.url)
        assert await client.exists(f"kvgate:rl:{{{t.id}}}:rpm")
        await client.aclose()
        async with gw.http.get(f"{gw.base_url}/readyz") as r:
            assert r.status == 200


async def test_redis_outage_fails_closed_when_configured(
    gateway_database: str, demo_model_dir: Path, tmp_path: Path, private_redis: RedisServer
) -> None:
    settings = make_settings(
        gateway_database,
        tmp_path,
        KVGATE_REDIS_URL=private_redis.url,
        KVGATE_RATELIMIT_FAIL_MODE="closed",
        KVGATE_REDIS_TIMEOUT_S="0.2",
    )
    async with live_gateway(settings, demo_model_dir) as gw:
        t = await gw.create_tenant("closed")
        private_redis.stop()
        status, _, body = await chat(gw, t.key)
        assert status == 503 and body["error"]["code"] == "rate_limiter_unavailable"


async def test_concurrency_limit(
    gateway_database: str, demo_model_dir: Path, tmp_path: Path
) -> None:
    async with live_gateway(make_settings(gateway_database, tmp_path), demo_model_dir) as gw:
        t = await gw.create_tenant("conc", limits={"max_concurrency": 1, "max_output_tokens": 400})
        slow = asyncio.create_task(chat(gw, t.key, max_tokens=400))
        await wait_for(lambda: gw.state.engine.cache_stats().blocks_in_use > 0)
        status, headers, body = await chat(gw, t.key)
        # No hold time measured yet: the oldest lease's expiry (KVGATE_LEASE_TTL_S) bounds it.
        assert status == 429 and 1 <= int(headers["Retry-After"]) <= 30
        assert "concurrent" in body["error"]["message"]
        assert (await slow)[0] == 200
        assert (await chat(gw, t.key))[0] == 200  # the lease came back
