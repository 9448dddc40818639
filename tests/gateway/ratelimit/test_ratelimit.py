"""Limiter semantics, identical for the Redis script and the in-process twin."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator

import pytest
import redis.asyncio as aioredis

from gateway.ratelimit import (
    Decision,
    Lease,
    Limiter,
    Limits,
    MemoryLimiter,
    RedisLimiter,
    Scope,
    make_client,
)
from gateway.ratelimit.types import format_duration
from tests.conftest import SHARED_REDIS_URL


@pytest.fixture(params=["memory", "redis"])
async def limiter(
    request: pytest.FixtureRequest, shared_redis: aioredis.Redis, redis_prefix: str
) -> AsyncIterator[Limiter]:
    if request.param == "memory":
        lim: Limiter = MemoryLimiter()
    else:
        lim = RedisLimiter(make_client(SHARED_REDIS_URL, 1.0), redis_prefix)
    yield lim
    if isinstance(lim, MemoryLimiter):
        lim.check_integrity()
    await lim.close()


async def admit(lim: Limiter, tenant: str, limits: Limits, tokens: int) -> Decision:
    return await lim.acquire(Lease.single(tenant, limits, tokens))


async def held(lim: Limiter, tenant: str, scope: Scope | None = None) -> int:
    if isinstance(lim, RedisLimiter):
        return await lim.active_leases(tenant, scope)
    assert isinstance(lim, MemoryLimiter)
    return lim.active_leases(tenant, *((scope.kind, scope.id) if scope else ()))


async def test_rpm_burst_is_exact_then_rejects_with_retry(limiter: Limiter) -> None:
    limits = Limits(rpm=5)
    decisions = [await admit(limiter, "t1", limits, 10) for _ in range(6)]
    assert [d.allowed for d in decisions] == [True] * 5 + [False]
    assert [d.requests.remaining for d in decisions[:5]] == [4, 3, 2, 1, 0]
    rejected = decisions[-1]
    assert rejected.reason == "requests" and rejected.lease is None
    assert rejected.scope == "tenant"
    # One request per 12 s refills; the next slot opens within 12 s.
    assert 11_000 <= rejected.retry_after_ms <= 12_000
    headers = rejected.headers()
    assert headers["x-ratelimit-limit-requests"] == "5"
    assert headers["x-ratelimit-remaining-requests"] == "0"
    assert headers["x-ratelimit-scope"] == "tenant"
    assert headers["Retry-After"] == "12"
    assert "x-ratelimit-limit-tokens" not in headers  # TPM unlimited here
    # Another tenant is unaffected.
    assert (await admit(limiter, "t2", limits, 10)).allowed


async def test_tpm_reserves_then_reconciles(limiter: Limiter) -> None:
    limits = Limits(tpm=1000)
    first = await admit(limiter, "t", limits, 600)
    assert first.allowed and first.tokens.remaining == 400
    second = await admit(limiter, "t", limits, 600)
    assert not second.allowed and second.reason == "tokens"
    assert second.tokens.remaining == 400  # a rejection takes nothing
    await limiter.release(first.lease, used_tokens=100)  # 500 tokens refunded
    await limiter.release(first.lease, used_tokens=100)  # idempotent: no second refund
    await limiter.release(second.lease or Lease.single("t", limits, 600), 0)  # rejected: no-op
    third = await admit(limiter, "t", limits, 600)
    assert third.allowed and 298 <= third.tokens.remaining <= 300
    h = third.headers()
    assert h["x-ratelimit-limit-tokens"] == "1000" and h["x-ratelimit-reset-tokens"].endswith("s")


async def test_rejected_lease_release_gives_nothing_back(limiter: Limiter) -> None:
    limits = Limits(tpm=1000)
    assert (await admit(limiter, "t", limits, 900)).allowed
    lease = Lease.single("t", limits, 900)
    assert not (await limiter.acquire(lease)).allowed
    await limiter.release(lease, used_tokens=0)  # would refund 900 if it were counted
    assert not (await admit(limiter, "t", limits, 900)).allowed


async def test_request_larger_than_tpm_is_never_admissible(limiter: Limiter) -> None:
    d = await admit(limiter, "t", Limits(rpm=10, tpm=100), 101)
    assert not d.allowed and d.reason == "too_large" and d.retry_after_ms == -1
    assert "Retry-After" not in d.headers()
    assert d.requests.remaining == 10  # nothing taken


async def test_concurrency_leases_and_truthful_retry_after(limiter: Limiter) -> None:
    limits = Limits(max_concurrency=2)
    a = await admit(limiter, "t", limits, 1)
    b = await admit(limiter, "t", limits, 1)
    c = await admit(limiter, "t", limits, 1)
    assert a.allowed and b.allowed and not c.allowed and c.reason == "concurrency"
    # No hold time measured yet: the oldest lease's expiry (TTL 30 s) is the honest bound.
    assert 28 <= int(c.headers()["Retry-After"]) <= 30
    await asyncio.sleep(0.05)
    await limiter.release(a.lease, 1)  # held ~50 ms: now the typical hold time is known
    d = await admit(limiter, "t", limits, 1)
    assert d.allowed
    e = await admit(limiter, "t", limits, 1)
    assert not e.allowed and 0 < e.retry_after_ms < 1000 and e.headers()["Retry-After"] == "1"
    await limiter.release(b.lease, 1)
    await limiter.release(d.lease, 1)
    assert await held(limiter, "t") == 0


async def test_raised_limit_applies_to_the_next_request(limiter: Limiter) -> None:
    assert (await admit(limiter, "t", Limits(rpm=1), 1)).allowed
    assert not (await admit(limiter, "t", Limits(rpm=1), 1)).allowed
    raised = await admit(limiter, "t", Limits(rpm=600), 1)
    assert raised.allowed and raised.requests.remaining == 598  # 2 of 600 used
    # Lowered again: the requests already made count against the new limit.
    assert not (await admit(limiter, "t", Limits(rpm=2), 1)).allowed


async def test_every_scope_must_admit_and_the_rejecting_scope_is_named(
    limiter: Limiter,
) -> None:
    tenant = Scope("tenant", "t", Limits(rpm=100, tpm=10_000, max_concurrency=10))
    key = Scope("key", "k1", Limits(rpm=2))
    visitor = Scope("visitor", "v1", Limits(max_concurrency=1))
    first = await limiter.acquire(Lease.new("t", (tenant, key, visitor), 10))
    assert first.allowed
    # Most restrictive per dimension: the key's RPM (1 of 2 left), the tenant's TPM.
    h = first.headers()
    assert h["x-ratelimit-limit-requests"] == "2" and h["x-ratelimit-remaining-requests"] == "1"
    assert h["x-ratelimit-limit-tokens"] == "10000" and h["x-ratelimit-scope"] == "key"
    busy = await limiter.acquire(Lease.new("t", (tenant, key, visitor), 10))
    assert not busy.allowed and busy.reason == "concurrency" and busy.scope == "visitor"
    other_visitor = Scope("visitor", "v2", Limits(max_concurrency=1))
    second = await limiter.acquire(Lease.new("t", (tenant, key, other_visitor), 10))
    assert second.allowed
    v3 = Scope("visitor", "v3", Limits())
    third = await limiter.acquire(Lease.new("t", (tenant, key, v3), 1))
    assert not third.allowed and third.reason == "requests" and third.scope == "key"
    assert third.headers()["x-ratelimit-limit-requests"] == "2"
    # Rejections took nothing from the tenant: 2 admitted requests, 20 tokens.
    assert second.states[0].requests.remaining == 98
    assert await held(limiter, "t") == 2 and await held(limiter, "t", visitor) == 1
    await limiter.release(first.lease, 5)
    await limiter.release(second.lease, 5)
    assert await held(limiter, "t") == 0 and await held(limiter, "t", visitor) == 0


async def test_a_charge_takes_one_request_from_every_scope_and_nothing_else(
    limiter: Limiter,
) -> None:
    tenant = Scope("tenant", "t", Limits(rpm=10, tpm=1000, max_concurrency=1))
    key = Scope("key", "k", Limits(rpm=2))
    charged = await limiter.charge(Lease.new("t", (tenant, key), 0))
    assert charged.allowed and charged.lease is None
    assert [s.requests.remaining for s in charged.states] == [9, 1]
    assert all(s.tokens is None for s in charged.states)
    assert await held(limiter, "t") == 0  # no lease: nothing to release
    # The admission that follows finds the request gone, all tokens and the concurrency slot.
    admitted = await limiter.acquire(Lease.new("t", (tenant, key), 1000))
    assert admitted.allowed and admitted.states[0].requests.remaining == 8
    assert admitted.states[0].tokens.remaining == 0 and admitted.states[1].requests.remaining == 0
    # No request left in the key scope: the charge is refused and takes nothing anywhere.
    refused = await limiter.charge(Lease.new("t", (tenant, key), 0))
    assert not refused.allowed and refused.reason == "requests" and refused.scope == "key"
    assert refused.headers()["x-ratelimit-remaining-requests"] == "0"
    assert 29_000 <= refused.retry_after_ms <= 30_000  # rpm 2: one slot every 30 s
    other_key = Scope("key", "k2", Limits(rpm=2))
    after = await limiter.charge(Lease.new("t", (tenant, other_key), 0))
    assert after.allowed and after.states[0].requests.remaining == 7  # the tenant lost none
    await limiter.release(admitted.lease, 1000)


async def test_a_charge_in_an_unlimited_scope_reports_nothing(limiter: Limiter) -> None:
    charged = await limiter.charge(Lease.single("t", Limits(), 0))
    assert charged.allowed and charged.states[0].requests is None
    assert charged.headers() == {"x-ratelimit-scope": "tenant"}


async def test_lease_expires_by_ttl_unless_renewed() -> None:
    now = [0.0]
    lim = MemoryLimiter(lease_ttl_s=1.0, clock=lambda: now[0])
    limits = Limits(max_concurrency=1)
    crashed = await admit(lim, "t", limits, 1)
    assert crashed.allowed
    assert not (await admit(lim, "t", limits, 1)).allowed
    await lim.renew([crashed.lease])  # the renewal task's work, at t = 0
    now[0] = 900.0
    await lim.renew(lim.book.live())
    now[0] = 1500.0  # 1.5 TTL after admission, 0.6 after the last renewal: still held
    assert not (await admit(lim, "t", limits, 1)).allowed
    now[0] = 1901.0  # the holder stopped renewing (crashed): freed one TTL later
    assert (await admit(lim, "t", limits, 1)).allowed
    lim.check_integrity()
    await lim.close()


async def test_gcra_refills_over_time() -> None:
    now = [0.0]
    lim = MemoryLimiter(clock=lambda: now[0])
    limits = Limits(rpm=60)
    assert all([(await admit(lim, "t", limits, 1)).allowed for _ in range(60)])
    assert not (await admit(lim, "t", limits, 1)).allowed
    now[0] = 1000.0  # one second = one request at 60 RPM
    assert (await admit(lim, "t", limits, 1)).allowed
    assert not (await admit(lim, "t", limits, 1)).allowed
    await lim.close()


async def test_concurrent_acquires_on_redis_are_exact(
    shared_redis: aioredis.Redis, redis_prefix: str
) -> None:
    # Two limiter instances with separate connection pools, racing on the same tenant.
    lims = [RedisLimiter(make_client(SHARED_REDIS_URL, 1.0), redis_prefix) for _ in range(2)]
    limits = Limits(rpm=25, max_concurrency=1000)
    results = await asyncio.gather(*(admit(lims[i % 2], "race", limits, 1) for i in range(60)))
    assert sum(d.allowed for d in results) == 25
    for lim in lims:
        await lim.close()


@pytest.mark.parametrize(
    ("ms", "text"),
    [(0, "0s"), (20, "20ms"), (1500, "1.5s"), (360_000, "6m0s"), (61_250, "1m1.25s")],
)
def test_format_duration(ms: float, text: str) -> None:
    assert format_duration(ms) == text


async def test_state_of_visitors_that_left_is_forgotten() -> None:
    now = [0.0]
    lim = MemoryLimiter(lease_ttl_s=1.0, clock=lambda: now[0])
    tenant = Scope("tenant", "t", Limits())
    for i in range(50):
        visitor = Scope("visitor", f"v{i}", Limits(rpm=20, tpm=1000, max_concurrency=2))
        decision = await lim.acquire(Lease.new("t", (tenant, visitor), 10))
        now[0] += 1.0
        await lim.release(decision.lease, 5)
        if i % 10 == 0:  # one in ten never released (its holder crashed)
            await lim.acquire(Lease.new("t", (tenant, visitor), 10))
    lim.check_integrity()
    assert lim.state_size() > 100
    now[0] += 700_000.0  # debts repaid, leases expired, hold times old
    lim.sweep(now[0])
    lim.check_integrity()
    assert lim.state_size() == 0
    await lim.close()


async def test_a_lease_takes_its_slots_of_the_concurrency(limiter: Limiter) -> None:
    """A request of n choices runs n engine requests: its lease holds n slots."""
    limits = Limits(max_concurrency=4)
    wide = await limiter.acquire(Lease.single("t", limits, 1, slots=3))
    assert wide.allowed and await held(limiter, "t") == 3
    two = await limiter.acquire(Lease.single("t", limits, 1, slots=2))
    assert not two.allowed and two.reason == "concurrency"
    one = await admit(limiter, "t", limits, 1)
    assert one.allowed and await held(limiter, "t") == 4
    assert not (await admit(limiter, "t", limits, 1)).allowed
    await limiter.release(wide.lease, 1)  # gives back all three slots ...
    await limiter.release(wide.lease, 1)  # ... once
    assert await held(limiter, "t") == 1
    again = await limiter.acquire(Lease.single("t", limits, 1, slots=3))
    assert again.allowed and await held(limiter, "t") == 4
    await limiter.release(again.lease, 1)
    await limiter.release(one.lease, 1)
    assert await held(limiter, "t") == 0


async def test_a_lease_wider_than_a_scope_is_never_admissible(limiter: Limiter) -> None:
    tenant = Scope("tenant", "t", Limits(rpm=10, max_concurrency=8))
    visitor = Scope("visitor", "v", Limits(max_concurrency=2))
    d = await limiter.acquire(Lease.new("t", (tenant, visitor), 1, slots=3))
    assert not d.allowed and d.reason == "too_wide" and d.scope == "visitor"
    assert d.retry_after_ms == -1 and "Retry-After" not in d.headers()
    assert d.states[0].requests.remaining == 10  # nothing taken
    assert await held(limiter, "t") == 0
    fits = await limiter.acquire(Lease.new("t", (tenant, visitor), 1, slots=2))
    assert fits.allowed and await held(limiter, "t") == 2
    await limiter.release(fits.lease, 1)


async def test_every_slot_of_a_lease_is_renewed_and_expires_together() -> None:
    now = [0.0]
    lim = MemoryLimiter(lease_ttl_s=1.0, clock=lambda: now[0])
    limits = Limits(max_concurrency=3)
    wide = await lim.acquire(Lease.single("t", limits, 1, slots=3))
    assert wide.allowed
    now[0] = 900.0
    await lim.renew(lim.book.live())
    now[0] = 1500.0
    assert lim.active_leases("t") == 3 and not (await admit(lim, "t", limits, 1)).allowed
    now[0] = 1901.0  # not renewed again: all three slots run out at once
    assert lim.active_leases("t") == 0
    assert (await lim.acquire(Lease.single("t", limits, 1, slots=3))).allowed
    lim.check_integrity()
    await lim.close()


async def test_a_lone_wide_lease_is_admitted_within_a_replica_share() -> None:
    """Failed over with share 1/2, a scope of 4 has 2 slots here: a 3-slot lease (which fits
    the whole limit) waits until the scope is empty here instead of never being admitted."""
    lim = MemoryLimiter()
    limits = Limits(max_concurrency=4)
    one = await lim.acquire(Lease.single("t", limits, 1), share=0.5)
    assert one.allowed
    wide = Lease.single("t", limits, 1, slots=3)
    assert (await lim.acquire(wide, share=0.5)).reason == "concurrency"
    await lim.release(one.lease, 1)
    assert (await lim.acquire(wide, share=0.5)).allowed
    assert not (await lim.acquire(Lease.single("t", limits, 1), share=0.5)).allowed
    await lim.release(wide, 1)
    lim.check_integrity()
    await lim.close()


# A clock reading where float addition rounds up: (now + 60000.0) - now > 60000.0 and
# ((now + 30000.0) + 30000.0) - now > 60000.0 (minutes after boot, time.monotonic() is this small).
ROUNDING_NOW_MS = 1004093.603


async def test_the_last_request_and_token_a_limit_allows_survive_clock_rounding() -> None:
    assert (ROUNDING_NOW_MS + 60000.0) - ROUNDING_NOW_MS > 60000.0  # the premise
    limiter = MemoryLimiter(clock=lambda: ROUNDING_NOW_MS)
    try:
        whole = Scope("tenant", "t", Limits(rpm=1, tpm=1000))
        first = await limiter.acquire(Lease.new("t", (whole,), 1000))
        assert first.allowed, first
        assert first.states[0].requests.remaining == 0 and first.states[0].tokens.remaining == 0
        halves = Scope("tenant", "u", Limits(rpm=2))
        charges = [await limiter.charge(Lease.new("u", (halves,), 0)) for _ in range(3)]
        assert [c.allowed for c in charges] == [True, True, False]
        assert [c.states[0].requests.remaining for c in charges[:2]] == [1, 0]
    finally:
        await limiter.close()


async def test_extend_reserves_more_tokens_for_a_held_lease(limiter: Limiter) -> None:
    """A later step of one request (the gateway's tool loop) takes TPM, never a request or a
    slot; the lease it hands back is the one to release, reconciled against the sum."""
    limits = Limits(rpm=2, tpm=1000, max_concurrency=1)
    first = await admit(limiter, "t", limits, 300)
    assert first.allowed and first.lease is not None
    more = await limiter.extend(first.lease, 400)
    assert more.allowed and more.lease is not None
    assert more.lease.reserved_tokens == 700 and more.lease.lease_id == first.lease.lease_id
    assert more.tokens is not None and more.tokens.remaining == 300
    assert await held(limiter, "t") == 1  # no second slot
    assert more.requests is not None and more.requests.remaining == 1  # no second request
    over = await limiter.extend(more.lease, 301)
    assert not over.allowed and over.reason == "tokens" and over.lease is None
    assert over.tokens is not None and over.tokens.remaining == 300  # nothing taken
    await limiter.release(more.lease, used_tokens=250)  # 450 of the 700 given back
    again = await admit(limiter, "t", limits, 750)
    assert again.allowed and again.tokens is not None and again.tokens.remaining == 0
    assert again.lease is not None
    await limiter.release(again.lease, 750)


async def test_extend_refuses_a_lease_no_longer_held(limiter: Limiter) -> None:
    limits = Limits(tpm=1000)
    first = await admit(limiter, "t", limits, 100)
    assert first.lease is not None
    await limiter.release(first.lease, 100)
    late = await limiter.extend(first.lease, 10)
    assert not late.allowed and late.reason == "concurrency" and late.lease is None
    too_large = await admit(limiter, "t", limits, 100)
    assert too_large.lease is not None
    refused = await limiter.extend(too_large.lease, 1001)  # more than a whole minute's TPM
    assert not refused.allowed and refused.reason == "too_large"
    await limiter.release(too_large.lease, 100)
