"""Unauthenticated input cannot make the key cache read the database per request or flush it.

Unknown keys, made-up tenants in forged session tokens and forged tokens naming a tenant that has
no session secret each cost a bounded number of reads (counted), and the valid keys' cached state
is never flushed by them. The events that may make an unknown id known forget its miss at once.
"""

from __future__ import annotations

import asyncio
import dataclasses
import time

from gateway.access import session_tokens as tokens
from gateway.access.auth import KeyCache
from tenants.events import TenantChanged
from tenants.runtime import KeyIdentity, WidgetPolicy
from tests.gateway.access.test_key_cache_events import (
    SITE,
    Clock,
    FakeStore,
    auth,
    make_cache,
    refused,
    runtime,
    session_token,
)

BURST = 200


def forged(tenant_id: str, key_id: str = "key_a1") -> str:
    """A token naming ``tenant_id``, signed with a secret nobody has."""
    claims = tokens.SessionClaims(tenant_id, key_id, SITE, "mallory", int(time.time()) + 600)
    return tokens.sign(claims, "f" * 64)


def without_secret(store: FakeStore, tenant_id: str) -> None:
    rt = store.runtimes[tenant_id]
    store.runtimes[tenant_id] = dataclasses.replace(rt, widget=WidgetPolicy())


async def test_a_burst_of_one_unknown_key_costs_one_read() -> None:
    cache, store, clock = make_cache()
    for _ in range(BURST):
        assert await refused(cache, "sk-unknown") == (401, "invalid_api_key")
    assert store.reads == 1 and cache.misses_served == BURST - 1
    clock.now += 1.0  # the miss TTL: read again, once
    for _ in range(BURST):
        await refused(cache, "sk-unknown")
    assert store.reads == 2


async def test_concurrent_unknown_keys_share_their_reads() -> None:
    cache, store, _ = make_cache()
    gate = asyncio.Event()
    plain = store.authenticate_key

    async def slow(secret: str) -> KeyIdentity | None:
        await gate.wait()
        return await plain(secret)

    store.authenticate_key = slow  # type: ignore[method-assign]
    burst = [asyncio.ensure_future(refused(cache, f"sk-unknown-{i % 5}")) for i in range(BURST)]
    await asyncio.sleep(0)
    gate.set()
    assert set(await asyncio.gather(*burst)) == {(401, "invalid_api_key")}
    assert store.reads == 5  # one per distinct key, not one per request


async def test_forged_tokens_for_a_tenant_without_a_secret_flush_nothing() -> None:
    """The attack: tokens naming a tenant that has no session secret. Before, each one flushed
    the tenant's keys and runtime from the cache and read the database again."""
    cache, store, clock = make_cache()
    without_secret(store, "acme")
    await auth(cache, "sk-acme-1")
    await auth(cache, "sk-acme-2")
    reads = store.reads
    for _ in range(BURST):
        assert await refused(cache, forged("acme"), SITE) == (401, "invalid_session_token")
    assert store.reads == reads + 1  # one re-read of the runtime (a secret may be new)
    await auth(cache, "sk-acme-1")
    await auth(cache, "sk-acme-2")
    assert store.reads == reads + 1  # the valid keys were not flushed
    clock.now += 1.0
    for _ in range(BURST):
        await refused(cache, forged("acme"), SITE)
    assert store.reads == reads + 2  # at most one re-read per miss TTL


async def test_forged_tokens_for_made_up_tenants_are_remembered_as_missing() -> None:
    cache, store, _ = make_cache()
    for _ in range(BURST):
        status = await refused(cache, forged("no-such-tenant"), SITE)
        assert status == (401, "invalid_session_token")
    assert store.reads == 1


async def test_a_secret_created_on_another_replica_is_found_at_once() -> None:
    """This replica cached the tenant before its secret existed and missed the event: the first
    token signed with the new secret re-reads the runtime and verifies."""
    cache, store, _ = make_cache()
    without_secret(store, "acme")
    await auth(cache, "sk-acme-1")
    await refused(cache, forged("acme"), SITE)  # remembered: acme has no secret
    secret = "n" * 64
    store.runtimes["acme"] = runtime("acme", widget=WidgetPolicy(session_secret=secret))
    await cache.on_event(TenantChanged("acme", "updated", groups=("secret",)))
    principal = await auth(cache, session_token(secret=secret), SITE)
    assert principal.end_user_id == "visitor-1"
    # Without the event, the tenant is read again once the miss TTL has passed.
    cache, store, clock = make_cache()
    without_secret(store, "acme")
    await refused(cache, forged("acme"), SITE)
    store.runtimes["acme"] = runtime("acme", widget=WidgetPolicy(session_secret=secret))
    clock.now += 1.0
    assert (await auth(cache, session_token(secret=secret), SITE)).identity.key_id == "key_a1"


async def test_events_that_may_create_a_key_or_tenant_forget_the_misses() -> None:
    cache, store, _ = make_cache()
    assert await refused(cache, "sk-new") == (401, "invalid_api_key")
    store.keys["sk-new"] = KeyIdentity("acme", "key_new", "server", ())
    await cache.on_event(TenantChanged("acme", "prompt", 2))  # unrelated: still missing
    assert await refused(cache, "sk-new") == (401, "invalid_api_key")
    await cache.on_event(TenantChanged("acme", "keys", key_id="key_new", key_change="created"))
    assert (await auth(cache, "sk-new")).identity.key_id == "key_new"  # at once
    # A tenant created a moment ago: its runtime was read missing, then the event arrives.
    assert await cache.runtime("gamma") is None
    store.runtimes["gamma"] = runtime("gamma")
    store.keys["sk-gamma"] = KeyIdentity("gamma", "key_g", "server", ())
    assert await refused(cache, "sk-gamma") == (401, "invalid_api_key")  # runtime missing
    await cache.on_event(TenantChanged("gamma", "created", status="active"))
    assert (await auth(cache, "sk-gamma")).runtime.tenant_id == "gamma"


async def test_misses_are_bounded() -> None:
    store, clock = FakeStore(), Clock()
    cache = KeyCache(store, ttl_s=5.0, clock=clock, max_misses=8)  # type: ignore[arg-type]
    for i in range(100):
        await refused(cache, f"sk-{i}")  # each checks the bound (check_integrity)
    assert store.reads == 100
    await refused(cache, "sk-99")  # among the newest 8: remembered
    await refused(cache, "sk-0")  # long forgotten: read again
    assert store.reads == 101
