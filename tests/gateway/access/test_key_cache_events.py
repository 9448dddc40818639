"""The key cache acts on exactly what a tenant event says, during a database outage too.

A revoked key is refused while the tenant's other keys keep chatting from last-known-good; a
suspension refuses the tenant; a policy change is never answered stale; prompt, limit, display
and key-limit changes only force a re-read. Events without details (an older replica's) keep
the coarse rule. The same holds for events that cross the Redis bridge from another replica.
Widget session tokens need their issuing key still valid and carry its limits.
"""

from __future__ import annotations

import asyncio
import dataclasses
import json
import time
from typing import cast

import redis.asyncio as aioredis
from aiohttp.test_utils import make_mocked_request

from gateway.access import session_tokens as tokens
from gateway.access.auth import KeyCache, Principal
from gateway.errors import ApiError
from gateway.ratelimit.scopes import VisitorDefaults, admission_scopes
from tenants.errors import StoreUnavailable
from tenants.events import EventBus, RedisEventBridge, TenantChanged
from tenants.runtime import KeyIdentity, TenantRuntime, WidgetPolicy
from tenants.settings import Limits
from tenants.store import TenantStore
from tests.conftest import SHARED_REDIS_URL

SITE = "https://shop.example"
SECRET = "s" * 64


class Clock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


class FakeStore:
    """The three reads the key cache makes, from dicts; all raise ``StoreUnavailable`` while
    ``down`` (as the real store does while its ``DbHealth`` fails fast)."""

    def __init__(self) -> None:
        self.keys: dict[str, KeyIdentity] = {}  # presented secret -> identity
        self.runtimes: dict[str, TenantRuntime] = {}
        self.down = False
        self.reads = 0

    def _read(self) -> None:
        self.reads += 1
        if self.down:
            raise StoreUnavailable("tenant database unavailable")

    async def authenticate_key(self, secret: str) -> KeyIdentity | None:
        self._read()
        return self.keys.get(secret)

    async def get_key_identity(self, key_id: str) -> KeyIdentity | None:
        self._read()
        return next((k for k in self.keys.values() if k.key_id == key_id), None)

    async def get_tenant_runtime(self, tenant_id: str) -> TenantRuntime | None:
        self._read()
        return self.runtimes.get(tenant_id)

    def revoke(self, key_id: str) -> None:
        self.keys = {s: k for s, k in self.keys.items() if k.key_id != key_id}


def runtime(tenant_id: str, **changes: object) -> TenantRuntime:
    rt = TenantRuntime(
        tenant_id=tenant_id,
        status="active",
        cache_salt="salt",
        prompt_version=1,
        prompt_text="p",
        limits=Limits(60, 10_000, 4, 256),
        allow_client_system=True,
        widget=WidgetPolicy(session_secret=SECRET),
    )
    return dataclasses.replace(rt, **changes)  # type: ignore[arg-type]


def make_cache() -> tuple[KeyCache, FakeStore, Clock]:
    store, clock = FakeStore(), Clock()
    for tid in ("acme", "beta"):
        store.runtimes[tid] = runtime(tid)
    store.keys["sk-acme-1"] = KeyIdentity("acme", "key_a1", "server", (), rpm=7, tpm=700)
    store.keys["sk-acme-2"] = KeyIdentity("acme", "key_a2", "server", ())
    store.keys["sk-beta-1"] = KeyIdentity("beta", "key_b1", "server", ())
    cache = KeyCache(cast(TenantStore, store), ttl_s=5.0, clock=clock, stale_max_s=600.0)
    return cache, store, clock


def request_with(bearer: str, origin: str | None = None):  # type: ignore[no-untyped-def]
    headers = {"Authorization": f"Bearer {bearer}"}
    if origin is not None:
        headers["Origin"] = origin
    return make_mocked_request("POST", "/v1/chat/completions", headers=headers)


async def auth(cache: KeyCache, bearer: str, origin: str | None = None) -> Principal:
    principal = await cache.authenticate(request_with(bearer, origin))
    cache.check_integrity()
    return principal


async def refused(cache: KeyCache, bearer: str, origin: str | None = None) -> tuple[int, str]:
    """(status, code) of a refusal; ``StoreUnavailable`` is the middleware's 503."""
    try:
        await cache.authenticate(request_with(bearer, origin))
    except ApiError as exc:
        cache.check_integrity()
        return exc.status, exc.code or ""
    except StoreUnavailable:
        return 503, "database_unavailable"
    raise AssertionError("expected a refusal")


async def warm_then_outage(cache: KeyCache, store: FakeStore, clock: Clock) -> None:
    for key in ("sk-acme-1", "sk-acme-2", "sk-beta-1"):
        await auth(cache, key)
    clock.now += 10.0  # past the TTL: every answer now needs the database or last-known-good
    store.down = True


async def test_revoked_key_refused_other_keys_of_the_tenant_keep_working() -> None:
    cache, store, clock = make_cache()
    await warm_then_outage(cache, store, clock)
    await cache.on_event(TenantChanged("acme", "keys", key_id="key_a1", key_change="revoked"))
    assert await refused(cache, "sk-acme-1") == (401, "invalid_api_key")
    assert (await auth(cache, "sk-acme-2")).identity.key_id == "key_a2"  # last-known-good
    assert (await auth(cache, "sk-beta-1")).runtime.tenant_id == "beta"
    # A revocation is permanent: the database need not confirm it, now or later.
    store.down = False
    reads = store.reads
    assert await refused(cache, "sk-acme-1") == (401, "invalid_api_key")
    assert store.reads == reads
    assert await cache.key("key_a1") is None


async def test_coarse_key_event_of_an_older_replica_distrusts_every_key_of_the_tenant() -> None:
    cache, store, clock = make_cache()
    await warm_then_outage(cache, store, clock)
    await cache.on_event(TenantChanged("acme", "keys"))
    assert await refused(cache, "sk-acme-1") == (503, "database_unavailable")
    assert await refused(cache, "sk-acme-2") == (503, "database_unavailable")
    assert (await auth(cache, "sk-beta-1")).identity.key_id == "key_b1"


async def test_key_limit_change_rereads_that_key_only_and_stays_servable() -> None:
    cache, store, _ = make_cache()
    await auth(cache, "sk-acme-1")
    await auth(cache, "sk-acme-2")
    store.keys["sk-acme-1"] = dataclasses.replace(store.keys["sk-acme-1"], rpm=1)
    reads = store.reads
    await cache.on_event(TenantChanged("acme", "keys", key_id="key_a1", key_change="limits"))
    assert (await auth(cache, "sk-acme-1")).identity.rpm == 1  # re-read at once
    assert store.reads == reads + 1  # that key alone: the runtime stayed fresh
    await auth(cache, "sk-acme-2")
    assert store.reads == reads + 1  # so did the other key
    await cache.on_event(TenantChanged("acme", "keys", key_id="key_a1", key_change="limits"))
    store.down = True
    assert (await auth(cache, "sk-acme-1")).identity.rpm == 1  # servable during an outage


async def test_suspension_refuses_the_tenant_and_resumption_lets_it_back() -> None:
    cache, store, clock = make_cache()
    await warm_then_outage(cache, store, clock)
    suspend = TenantChanged("acme", "updated", 1, status="suspended", groups=("status",))
    await cache.on_event(suspend)
    assert await refused(cache, "sk-acme-1") == (403, "tenant_suspended")
    assert await refused(cache, "sk-acme-2") == (403, "tenant_suspended")
    assert (await auth(cache, "sk-beta-1")).runtime.status == "active"
    resume = TenantChanged("acme", "updated", 1, status="active", groups=("status",))
    await cache.on_event(resume)
    assert (await auth(cache, "sk-acme-1")).runtime.status == "active"


async def test_policy_change_is_never_served_stale_display_changes_are() -> None:
    cache, store, clock = make_cache()
    await warm_then_outage(cache, store, clock)
    await cache.on_event(TenantChanged("acme", "updated", groups=("widget", "profile")))
    assert (await auth(cache, "sk-acme-1")).runtime.tenant_id == "acme"
    await cache.on_event(TenantChanged("acme", "updated", groups=("policy",)))
    assert await refused(cache, "sk-acme-1") == (503, "database_unavailable")
    await cache.on_event(TenantChanged("beta", "updated"))  # coarse: may have been a suspension
    assert await refused(cache, "sk-beta-1") == (503, "database_unavailable")


async def test_status_change_without_the_status_is_never_served_stale() -> None:
    cache, store, clock = make_cache()
    await warm_then_outage(cache, store, clock)
    await cache.on_event(TenantChanged("acme", "updated", groups=("status",)))
    assert await refused(cache, "sk-acme-1") == (503, "database_unavailable")


async def test_prompt_and_limit_changes_force_a_reread_but_stay_servable() -> None:
    cache, store, _ = make_cache()
    await auth(cache, "sk-acme-1")
    store.runtimes["acme"] = runtime("acme", prompt_version=2)
    await cache.on_event(TenantChanged("acme", "prompt", 2))
    assert (await auth(cache, "sk-acme-1")).runtime.prompt_version == 2
    store.runtimes["acme"] = runtime("acme", prompt_version=2, limits=Limits(1, 1, 1, 1))
    await cache.on_event(TenantChanged("acme", "limits", 2))
    store.down = True
    assert (await auth(cache, "sk-acme-1")).runtime.prompt_version == 2  # old limits, stale ok
    store.down = False
    assert (await auth(cache, "sk-acme-1")).runtime.limits.rpm == 1


def session_token(key_id: str = "key_a1", tenant_id: str = "acme", secret: str = SECRET) -> str:
    claims = tokens.SessionClaims(tenant_id, key_id, SITE, "visitor-1", int(time.time()) + 600)
    return tokens.sign(claims, secret)


async def test_session_token_needs_its_issuing_key_and_carries_its_limits() -> None:
    cache, store, clock = make_cache()
    principal = await auth(cache, session_token(), SITE)
    assert principal.is_widget and principal.end_user_id == "visitor-1"
    assert (principal.identity.key_id, principal.identity.rpm) == ("key_a1", 7)
    scopes = admission_scopes(
        principal.runtime, principal.identity, "visitor-1", "127.0.0.1", VisitorDefaults()
    )
    assert [(s.kind, s.id) for s in scopes][:2] == [("tenant", "acme"), ("key", "key_a1")]
    assert scopes[1].limits.rpm == 7 and scopes[2].kind == "visitor"
    # During an outage the issuer is known from last-known-good, until it is revoked.
    await auth(cache, session_token("key_a2"), SITE)
    clock.now += 10.0
    store.down = True
    assert (await auth(cache, session_token(), SITE)).identity.key_id == "key_a1"
    await cache.on_event(TenantChanged("acme", "keys", key_id="key_a1", key_change="revoked"))
    assert await refused(cache, session_token(), SITE) == (401, "invalid_session_token")
    assert (await auth(cache, session_token("key_a2"), SITE)).identity.key_id == "key_a2"
    store.down = False
    store.revoke("key_a2")  # revoked with no event seen here: found at the next read
    clock.now += 10.0
    assert await refused(cache, session_token("key_a2"), SITE) == (401, "invalid_session_token")
    # A key id of another tenant, or a widget key, cannot issue.
    assert await refused(cache, session_token("key_b1"), SITE) == (401, "invalid_session_token")
    store.keys["wk-acme"] = KeyIdentity("acme", "key_w", "widget", (SITE,))
    assert await refused(cache, session_token("key_w"), SITE) == (401, "invalid_session_token")


async def test_secret_rotation_event_ends_tokens_during_an_outage() -> None:
    cache, store, clock = make_cache()
    await auth(cache, session_token(), SITE)
    await auth(cache, "sk-acme-1")
    clock.now += 10.0
    store.down = True
    await cache.on_event(TenantChanged("acme", "updated", groups=("secret",)))
    assert (await refused(cache, session_token(), SITE))[0] in (401, 503)
    assert (await auth(cache, "sk-acme-1")).identity.key_id == "key_a1"  # keys unaffected
    store.down = False
    new_secret = "n" * 64
    store.runtimes["acme"] = runtime("acme", widget=WidgetPolicy(session_secret=new_secret))
    assert await refused(cache, session_token(), SITE) == (401, "invalid_session_token")
    assert (await auth(cache, session_token(secret=new_secret), SITE)).identity.rpm == 7


async def test_deleted_tenant_is_dropped() -> None:
    cache, store, clock = make_cache()
    await warm_then_outage(cache, store, clock)
    await cache.on_event(TenantChanged("acme", "deleted", status="deleted"))
    assert await refused(cache, "sk-acme-2") == (503, "database_unavailable")
    assert (await auth(cache, "sk-beta-1")).identity.key_id == "key_b1"


async def test_exact_events_act_across_the_redis_bridge(redis_channel: str) -> None:
    """Replica B's cache, during an outage, acts on events published on replica A (and on an
    old-format payload sent straight to the channel) exactly as on its own."""
    bus_a, bus_b = EventBus(), EventBus()
    cache, store, clock = make_cache()
    bus_b.subscribe(cache.on_event)
    seen: list[TenantChanged] = []

    async def record(event: TenantChanged) -> None:
        seen.append(event)

    bus_b.subscribe(record)
    url = SHARED_REDIS_URL
    bridges = [RedisEventBridge.from_url(b, url, redis_channel) for b in (bus_a, bus_b)]
    for bridge in bridges:
        await bridge.start()
    raw = aioredis.from_url(SHARED_REDIS_URL)
    try:
        await warm_then_outage(cache, store, clock)
        revoke = TenantChanged("acme", "keys", key_id="key_a1", key_change="revoked")
        await bus_a.publish(revoke)
        await wait_until(lambda: len(seen) == 1)
        assert seen == [revoke]
        assert await refused(cache, "sk-acme-1") == (401, "invalid_api_key")
        assert (await auth(cache, "sk-acme-2")).identity.key_id == "key_a2"
        suspend = TenantChanged("beta", "updated", status="suspended", groups=("status",))
        await bus_a.publish(suspend)
        await wait_until(lambda: len(seen) == 2)
        assert seen[1] == suspend
        assert await refused(cache, "sk-beta-1") == (403, "tenant_suspended")
        # An older replica's payload: no key id, so every key of the tenant is distrusted.
        old = {"origin": "old-replica", "event": {"tenant_id": "acme", "kind": "keys"}}
        await raw.publish(redis_channel, json.dumps(old))
        await wait_until(lambda: len(seen) == 3)
        assert seen[2] == TenantChanged("acme", "keys")
        assert await refused(cache, "sk-acme-2") == (503, "database_unavailable")
    finally:
        await raw.aclose()
        for bridge in bridges:
            await bridge.aclose()


async def wait_until(cond, timeout: float = 3.0) -> None:  # type: ignore[no-untyped-def]
    async with asyncio.timeout(timeout):
        while not cond():
            await asyncio.sleep(0.01)
