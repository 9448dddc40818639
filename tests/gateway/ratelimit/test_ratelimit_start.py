"""Starting without Redis: fail open starts degraded and recovers when Redis comes; fail closed
refuses to start with one line naming the variable (no traceback)."""

from __future__ import annotations

import asyncio
import time
from pathlib import Path

import redis.asyncio as aioredis

from gateway.commands.serve import redis_start_error
from gateway.ratelimit import FailoverLimiter
from tests.e2e.servers import ServeProcess
from tests.gateway.harness import live_gateway, make_settings, wait_for
from tests.gateway.ratelimit.test_limits_http import chat
from tests.gateway.redis_server import RedisServer, free_port


async def test_fail_open_starts_degraded_and_recovers_when_redis_comes(
    gateway_database: str, demo_model_dir: Path, tmp_path: Path, private_redis: RedisServer
) -> None:
    private_redis.stop()  # unreachable at start
    settings = make_settings(
        gateway_database,
        tmp_path,
        KVGATE_REDIS_URL=private_redis.url,
        KVGATE_REDIS_RETRY_S="0.1",
        KVGATE_REDIS_TIMEOUT_S="0.2",
    )
    async with live_gateway(settings, demo_model_dir) as gw:
        limiter = gw.state.limiter
        assert isinstance(limiter, FailoverLimiter) and limiter.down
        t = await gw.create_tenant("early", limits={"rpm": 3})
        assert [(await chat(gw, t.key))[0] for _ in range(4)] == [200, 200, 200, 429]
        async with gw.http.get(f"{gw.base_url}/readyz") as r:
            assert r.status == 200 and (await r.json())["redis"] == "degraded"

        private_redis.start()
        await wait_for(lambda: not limiter.down, timeout=5.0)
        # The shared state continues from what this replica counted meanwhile.
        assert (await chat(gw, t.key))[0] == 429
        client = aioredis.Redis.from_url(private_redis.url)
        assert await client.exists(f"kvgate:rl:{{{t.id}}}:rpm")
        # The tenant-event bridge subscribed once Redis answered (retried in the background).
        channel = settings.tenants.event_channel
        deadline = time.monotonic() + 10
        while dict(await client.pubsub_numsub(channel)).get(channel.encode(), 0) < 1:
            assert time.monotonic() < deadline, "the event bridge never subscribed"
            await asyncio.sleep(0.1)
        await client.aclose()
        async with gw.http.get(f"{gw.base_url}/readyz") as r:
            assert r.status == 200 and (await r.json())["redis"] == "up"


async def test_fail_closed_refuses_to_start_with_one_line(tmp_path: Path) -> None:
    url = f"redis://kvgate:s3cret-pw@127.0.0.1:{free_port()}/0"
    proc = ServeProcess(tmp_path, {"KVGATE_REDIS_URL": url, "KVGATE_RATELIMIT_FAIL_MODE": "closed"})
    proc.start()
    assert proc.proc is not None
    rc = await asyncio.to_thread(proc.proc.wait, 90)
    out = proc.read_output()
    assert rc != 0, out
    assert "Traceback" not in out and "s3cret-pw" not in out, out
    assert out.strip().splitlines()[-1] == redis_start_error(url)
    assert "KVGATE_REDIS_URL" in redis_start_error(url)
