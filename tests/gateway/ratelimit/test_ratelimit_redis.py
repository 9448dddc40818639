"""Shared limiter behaviour that needs real Redis processes: replicas, outages, round trips."""

from __future__ import annotations

import asyncio
import json
import subprocess
import sys
import time
from pathlib import Path

import pytest
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
from tests.conftest import SHARED_REDIS_URL
from tests.gateway.redis_server import RedisServer

ROOT = Path(__file__).resolve().parents[3]

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


async def test_charges_fail_over_and_the_debt_is_mirrored(private_redis: RedisServer) -> None:
    lim = FailoverLimiter(
        RedisLimiter(make_client(private_redis.url, 0.2), "kvgate:"),
        MemoryLimiter(),
        fail_open=True,
        retry_s=60.0,
    )
    limits = Limits(rpm=3)
    assert (await lim.charge(Lease.single("t", limits, 0))).allowed  # in Redis, mirrored
    private_redis.stop()
    down = await lim.charge(Lease.single("t", limits, 0))
    assert lim.down and down.allowed and down.states[0].requests.remaining == 1
    assert (await lim.acquire(Lease.single("t", limits, 1))).allowed
    refused = await lim.charge(Lease.single("t", limits, 0))
    assert not refused.allowed and refused.reason == "requests"
    await lim.close()


async def test_a_charge_fails_closed_when_configured(private_redis: RedisServer) -> None:
    lim = FailoverLimiter(
        RedisLimiter(make_client(private_redis.url, 0.2), "kvgate:"),
        MemoryLimiter(),
        fail_open=False,
        retry_s=60.0,
    )
    private_redis.stop()
    with pytest.raises(LimiterUnavailable):
        await lim.charge(Lease.single("t", Limits(rpm=5), 0))
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


async def test_a_lease_released_while_its_admission_is_in_doubt_is_never_admitted_later(
    private_redis: RedisServer,
) -> None:
    lim = RedisLimiter(make_client(private_redis.url, 1.0), "kvgate:")
    limits = Limits(tpm=1000, max_concurrency=1)
    late = Lease.single("t", limits, 600)
    # The admission call was sent, then the caller gave up (timeout, disconnect) and released
    # the lease before Redis ran the script: the release leaves a tombstone...
    lim.book.begin(late)
    await lim.release(late, used_tokens=0)
    # ... so when the late script runs, it takes nothing.
    assert not (await lim.acquire(late)).allowed
    assert await lim.active_leases("t") == 0
    fresh = await lim.acquire(Lease.single("t", limits, 1000))
    assert fresh.allowed  # nothing of the late lease's 600 tokens was reserved
    # The same admission sent twice (a retry after a lost reply) counts once.
    again = await lim.acquire(fresh.lease)
    assert again.allowed and again.tokens.remaining == 0
    assert await lim.active_leases("t") == 1
    await lim.release(fresh.lease, 1000)
    assert await lim.active_leases("t") == 0
    lim.book.check_integrity()
    assert len(lim.book) == 0
    await lim.close()


async def test_leases_are_renewed_in_redis_while_held(private_redis: RedisServer) -> None:
    lim = RedisLimiter(make_client(private_redis.url, 1.0), "kvgate:", lease_ttl_s=0.6)
    admin = aioredis.Redis.from_url(private_redis.url)
    limits = Limits(max_concurrency=1)
    held = await lim.acquire(Lease.single("t", limits, 1))
    assert held.allowed
    await asyncio.sleep(1.0)  # longer than the TTL: the renewal (every 0.2 s) kept it
    assert not (await lim.acquire(Lease.single("t", limits, 1))).allowed
    assert lim.renewer.rounds >= 3
    key = "kvgate:rl:{t}:leases"
    expiry = await admin.zscore(key, held.lease.lease_id)
    seconds, micros = await admin.time()
    now_ms = seconds * 1000 + micros / 1000
    assert now_ms < expiry <= now_ms + 700
    await lim.renewer.close()  # the replica "crashes": nobody renews any more
    await asyncio.sleep(0.7)
    assert (await lim.acquire(Lease.single("t", limits, 1))).allowed
    await lim.close()
    await admin.aclose()


async def test_a_restart_costs_no_failover_for_stale_pooled_connections(
    private_redis: RedisServer,
) -> None:
    lim = FailoverLimiter(
        RedisLimiter(make_client(private_redis.url, 0.5), "kvgate:"),
        MemoryLimiter(),
        retry_s=0.05,
    )
    limits = Limits(rpm=10_000)
    # Ten concurrent admissions leave ten pooled connections.
    await asyncio.gather(*(lim.acquire(Lease.single("t", limits, 1)) for _ in range(10)))
    private_redis.stop()
    private_redis.start()
    for _ in range(12):  # each of the stale connections is met once, then replaced
        assert (await lim.acquire(Lease.single("t", limits, 1))).allowed
    assert lim.failovers == 0 and lim.fallback_decisions == 0
    await lim.close()


async def _hammer(lim: FailoverLimiter, limits: Limits, until: float, admitted: list[int]) -> None:
    while time.monotonic() < until:
        lease = Lease.single("busy", limits, 1)
        decision = await lim.acquire(lease)
        admitted.append(int(decision.allowed))
        await lim.release(lease, 1)
        await asyncio.sleep(0.005)


async def test_two_replicas_through_a_redis_restart_stay_within_a_quarter_of_the_limit(
    private_redis: RedisServer,
) -> None:
    def replica() -> FailoverLimiter:
        return FailoverLimiter(
            RedisLimiter(make_client(private_redis.url, 0.2), "kvgate:"),
            MemoryLimiter(),
            retry_s=0.1,
            heartbeat_s=0.1,
        )

    replicas = [replica(), replica()]
    for lim in replicas:
        await lim.warm()
    await replicas[0].beat()  # both announced: each sees two live replicas
    assert [lim.share for lim in replicas] == [0.5, 0.5]
    limits = Limits(rpm=100)
    admitted: list[int] = []
    t0 = time.monotonic()
    load = [asyncio.ensure_future(_hammer(lim, limits, t0 + 3.5, admitted)) for lim in replicas]
    await asyncio.sleep(0.8)  # the burst of 100 is spent through Redis
    private_redis.stop()
    await asyncio.sleep(1.5)  # each replica on its own, with half of what Redis had left
    private_redis.start()  # empty: the replicas' debts seed it again
    await asyncio.gather(*load)
    elapsed_min = (time.monotonic() - t0) / 60
    exact = 100 + 100 * elapsed_min  # the burst plus the refill over the run
    assert all(lim.failovers == 1 and lim.fallback_decisions > 0 for lim in replicas)
    assert all(not lim.down for lim in replicas)
    assert exact - 2 <= sum(admitted) <= 1.25 * exact, (sum(admitted), exact)
    for lim in replicas:
        lim.check_integrity()
        await lim.close()


async def test_every_slot_of_a_lease_is_renewed_in_redis(private_redis: RedisServer) -> None:
    lim = RedisLimiter(make_client(private_redis.url, 1.0), "kvgate:", lease_ttl_s=0.6)
    admin = aioredis.Redis.from_url(private_redis.url)
    limits = Limits(max_concurrency=3)
    wide = await lim.acquire(Lease.single("t", limits, 1, slots=3))
    assert wide.allowed and await lim.active_leases("t") == 3
    await asyncio.sleep(1.0)  # longer than the TTL: the renewal kept every slot
    assert not (await lim.acquire(Lease.single("t", limits, 1))).allowed
    key = "kvgate:rl:{t}:leases"
    lease_id = wide.lease.lease_id
    members = [lease_id, f"{lease_id}:1", f"{lease_id}:2"]
    # one read (a renewal is one script, so all-or-none of them moved): three reads could
    # straddle a renewal and see two expiries
    expiries = await admin.zmscore(key, members)
    assert len(set(expiries)) == 1 and expiries[0] is not None
    await lim.release(wide.lease, 1)
    assert await lim.active_leases("t") == 0
    await lim.close()
    await admin.aclose()


async def test_slots_follow_a_lease_through_a_redis_outage(private_redis: RedisServer) -> None:
    """The fail-over mirror adopts a lease with its slots, so the in-process limiter counts
    them while Redis is away; back up, Redis takes a lease's slots again."""
    lim = FailoverLimiter(
        RedisLimiter(make_client(private_redis.url, 0.2), "kvgate:"),
        MemoryLimiter(),
        fail_open=True,
        retry_s=0.05,
    )
    limits = Limits(max_concurrency=4)
    wide = await lim.acquire(Lease.single("t", limits, 1, slots=3))
    assert wide.allowed and lim.fallback.active_leases("t") == 3
    private_redis.stop()
    assert (await lim.acquire(Lease.single("t", limits, 1))).allowed  # the 4th slot
    assert lim.down and lim.fallback.active_leases("t") == 4
    assert not (await lim.acquire(Lease.single("t", limits, 1))).allowed
    await lim.release(wide.lease, 1)
    assert lim.fallback.active_leases("t") == 1
    lim.check_integrity()
    private_redis.start()  # empty: nothing of the lease is left to give back, and nothing fails
    await _wait_for(lambda: not lim.down)
    again = await lim.acquire(Lease.single("t", limits, 1, slots=4))
    assert again.allowed and await lim.primary.active_leases("t") == 4
    await lim.release(again.lease, 1)
    assert await lim.primary.active_leases("t") == 0
    await lim.close()
