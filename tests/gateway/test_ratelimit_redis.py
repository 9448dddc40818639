"""Shared limiter behaviour that needs real Redis processes: replicas, outages, round trips."""

from __future__ import annotations

import asyncio
import json
import subprocess
import sys
import time
from pathlib import Path

import redis.asyncio as aioredis

from gateway.ratelimit import (
    FailoverLimiter,
    Lease,
    Limits,
    MemoryLimiter,
    RedisLimiter,
    make_client,
)
from gateway.ratelimit.types import LimiterUnavailable
from tests.gateway.conftest import SHARED_REDIS_URL
from tests.gateway.redis_server import RedisServer

ROOT = Path(__file__).resolve().parents[2]

# One "replica": connects, says ready, waits for "go", then makes ``n`` admissions 5 ms apart
# (so the two replicas interleave) plus a burst of ``n`` concurrent ones.
_REPLICA = """
import asyncio, json, sys
from gateway.ratelimit import Lease, Limits, RedisLimiter, make_client
url, prefix, n = sys.argv[1], sys.argv[2], int(sys.argv[3])
async def main():
    lim = RedisLimiter(make_client(url, 2.0), prefix)
    await lim.ping()
    print("ready", flush=True)
    sys.stdin.readline()
    limits = Limits(rpm=30, tpm=3000)
    allowed = 0
    for _ in range(n):
        allowed += (await lim.acquire(Lease.single("shared", limits, 50))).allowed
        await asyncio.sleep(0.005)
    ds = await asyncio.gather(*(lim.acquire(Lease.single("shared", limits, 50)) for _ in range(n)))
    print(json.dumps(allowed + sum(d.allowed for d in ds)))
    await lim.close()
asyncio.run(main())
"""


async def test_two_processes_admit_no_more_than_the_limit(
    shared_redis: aioredis.Redis, redis_prefix: str
) -> None:
    procs = [
        subprocess.Popen(
            [sys.executable, "-c", _REPLICA, SHARED_REDIS_URL, redis_prefix, "20"],
            cwd=ROOT,
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            text=True,
        )
        for _ in range(2)
    ]
    for p in procs:
        assert p.stdout.readline().strip() == "ready"
    for p in procs:
        p.stdin.write("go\n")
        p.stdin.flush()
    counts = [json.loads(p.communicate(timeout=30)[0]) for p in procs]
    # rpm=30, tpm=3000 at 50 tokens (60 requests' worth): RPM binds; 80 tries in total.
    assert sum(counts) == 30, counts
    assert all(c > 0 for c in counts), counts


async def client_commands(url: str, action) -> list[str]:  # type: ignore[no-untyped-def]
    """Commands that clients (not scripts) sent to Redis while ``action()`` ran (MONITOR)."""
    admin = aioredis.Redis.from_url(url)
    marker = aioredis.Redis.from_url(url)
    await marker.ping()  # connected before monitoring: its handshake is not the action's
    seen: list[str] = []
    async with admin.monitor() as mon:
        await action()
        await marker.echo("kvgate-monitor-end")
        while True:
            cmd = await mon.next_command()
            if "kvgate-monitor-end" in cmd["command"]:
                break
            if cmd.get("client_type") != "lua":
                seen.append(cmd["command"].split()[0].upper())
    await admin.aclose()
    await marker.aclose()
    return seen


async def test_one_round_trip_per_admission(private_redis: RedisServer) -> None:
    lim = RedisLimiter(make_client(private_redis.url, 1.0), "kvgate:")
    limits = Limits(rpm=100, tpm=1000, max_concurrency=4)
    await lim.acquire(Lease.single("t", limits, 10))  # connects and loads the script
    decisions = []

    async def admit() -> None:
        decisions.append(await lim.acquire(Lease.single("t", limits, 10)))

    assert await client_commands(private_redis.url, admit) == ["EVALSHA"]
    assert decisions[0].allowed

    async def release() -> None:
        await lim.release(decisions[0].lease, 4)

    assert await client_commands(private_redis.url, release) == ["EVALSHA"]
    await lim.close()


async def test_noscript_falls_back_to_eval(private_redis: RedisServer) -> None:
    lim = RedisLimiter(make_client(private_redis.url, 1.0), "kvgate:")
    admin = aioredis.Redis.from_url(private_redis.url)
    assert (await lim.acquire(Lease.single("t", Limits(rpm=2), 1))).allowed
    await admin.script_flush()
    assert (await lim.acquire(Lease.single("t", Limits(rpm=2), 1))).allowed
    assert not (
        await lim.acquire(Lease.single("t", Limits(rpm=2), 1))
    ).allowed  # state survived the flush
    await lim.close()
    await admin.aclose()


async def _wait_for(cond, timeout: float = 5.0) -> None:  # type: ignore[no-untyped-def]
    deadline = time.monotonic() + timeout
    while not cond():
        assert time.monotonic() < deadline, "condition not reached"
        await asyncio.sleep(0.02)


async def test_fail_open_while_redis_is_down_and_recover(private_redis: RedisServer) -> None:
    lim = FailoverLimiter(
        RedisLimiter(make_client(private_redis.url, 0.2), "kvgate:"),
        MemoryLimiter(),
        fail_open=True,
        retry_s=0.05,
    )
    limits = Limits(rpm=100, max_concurrency=10)
    before = await lim.acquire(Lease.single("t", limits, 1))
    assert not lim.down

    private_redis.stop()
    during = await lim.acquire(Lease.single("t", limits, 1))
    assert during.allowed
    assert lim.down and lim.failovers == 1 and lim.fallback_decisions == 1
    await lim.release(before.lease, 1)  # Redis lease: release fails quietly (TTL frees it)
    await lim.release(during.lease, 1)
    assert lim.fallback.active_leases("t") == 0

    private_redis.start()  # same port, empty data, no cached script (NOSCRIPT path)
    await _wait_for(lambda: not lim.down)
    after = await lim.acquire(Lease.single("t", limits, 1))
    assert after.allowed and not lim.down
    assert lim.failovers == 1
    await lim.release(after.lease, 1)
    assert await lim.primary.active_leases("t") == 0
    await lim.close()


async def test_fail_closed_raises(private_redis: RedisServer) -> None:
    lim = FailoverLimiter(
        RedisLimiter(make_client(private_redis.url, 0.2), "kvgate:"),
        MemoryLimiter(),
        fail_open=False,
        retry_s=0.05,
    )
    private_redis.stop()
    try:
        await lim.acquire(Lease.single("t", Limits(rpm=5), 1))
    except LimiterUnavailable:
        pass
    else:
        raise AssertionError("expected LimiterUnavailable")
    assert lim.fallback_decisions == 0
    await lim.close()
