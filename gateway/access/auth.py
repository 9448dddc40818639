"""API key -> tenant, cached in memory with a short TTL and acted on by tenant change events.

The cache key is the SHA-256 of the presented key (the key itself is never kept). Runtime views
(status, limits, prompt version) are cached per tenant with the same TTL and invalidated by
events, so a suspension or a limit change applies at once on this replica and within the TTL
on replicas that miss the event. While the tenant database is unreachable, known keys and
tenants are served from their last-known-good state (gateway/access/lkg.py), for a bounded time.

Unknown keys, key ids and tenant ids are remembered as missing for ``miss_ttl_s`` (bounded in
number), so whatever a client sends costs at most one read per distinct value per that time;
the events that may make one known (a key or tenant created, a tenant restored) forget those
misses at once, so a key created a moment ago works at once. Nothing a client sends
invalidates cached state: a session token naming a tenant without a session secret re-reads
that tenant's runtime at most once per ``miss_ttl_s`` (the secret may have been created on
another replica a moment ago), and never touches its keys.
"""

from __future__ import annotations

import dataclasses
import hashlib
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from aiohttp import web

from gateway.access import session_tokens
from gateway.access.lkg import LastKnownGood
from gateway.access.misses import RecentMisses
from gateway.errors import ApiError
from tenants.events import TenantChanged
from tenants.runtime import KeyIdentity, TenantRuntime
from tenants.store import TenantStore

CORS_ORIGIN = web.RequestKey("cors_origin", str)  # the checked Origin of a widget request


def _invalid_key() -> ApiError:
    return ApiError(401, "invalid API key", type_="authentication_error", code="invalid_api_key")


@dataclass(frozen=True)
class Principal:
    identity: KeyIdentity
    runtime: TenantRuntime
    # The end user behind a widget request: a session token's user, else None (the limiter then
    # keys per-visitor limits on the client address).
    end_user_id: str | None = None

    @property
    def is_widget(self) -> bool:
        """Browser traffic: a widget key or a widget session token."""
        return self.identity.kind == "widget"

    @property
    def allow_client_system(self) -> bool:
        """Client system/developer messages: the tenant's rule, and for widget traffic also the
        tenant's explicit widget opt-in (off by default)."""
        rt = self.runtime
        return rt.allow_client_system and (not self.is_widget or rt.widget.allow_client_system)

    def fair_share(self) -> dict[str, Any]:
        """The engine's fair-share fields of this principal's requests (GenerateOptions):
        the tenant, its weight and the key's priority class (engine/core/fairness.py)."""
        weight = self.runtime.limits.weight
        return {
            "tenant": self.runtime.tenant_id,
            "weight": 1.0 if weight is None else weight,
            "priority": self.identity.priority,
        }


def _origin_not_allowed(message: str) -> ApiError:
    return ApiError(403, message, type_="permission_error", code="origin_not_allowed")


def _cors_for_error(request: web.Request) -> None:
    origin = request.headers.get("Origin")
    if origin is not None:
        request[CORS_ORIGIN] = origin


def _require_active(rt: TenantRuntime | None) -> TenantRuntime:
    if rt is None or rt.status == "deleted":
        raise _invalid_key()
    if rt.status != "active":
        raise ApiError(
            403,
            f"tenant is {rt.status}",
            type_="permission_error",
            code=f"tenant_{rt.status}",
        )
    return rt


class KeyCache:
    """Key -> identity and tenant -> runtime, each a ``LastKnownGood`` table: fresh for
    ``ttl_s``, and while the database is unreachable served as last read for up to
    ``stale_max_s`` (unknown keys then get 503: there is nothing to fall back on)."""

    def __init__(
        self,
        store: TenantStore,
        ttl_s: float,
        clock: Callable[[], float] = time.monotonic,
        on_use: Callable[[str], None] | None = None,
        stale_max_s: float = 900.0,
        miss_ttl_s: float = 1.0,
        max_misses: int = 10_000,
    ) -> None:
        self._store = store
        self._on_use = on_use  # key id -> None (records last use; no I/O)
        self._clock = clock

        def table() -> LastKnownGood[Any]:
            return LastKnownGood(
                ttl_s, stale_max_s, clock, miss_ttl_s=miss_ttl_s, max_misses=max_misses
            )

        self._keys: LastKnownGood[KeyIdentity] = table()
        self._by_id: LastKnownGood[KeyIdentity] = table()
        self._runtimes: LastKnownGood[TenantRuntime] = table()
        # Tenants whose runtime a session token made us re-read and that still had no secret.
        self._no_secret = RecentMisses(miss_ttl_s, max_misses)
        self.stale_max_s = stale_max_s

    @property
    def lookups(self) -> int:
        """Database round trips attempted (tests check the cache works)."""
        return self._keys.loads + self._by_id.loads + self._runtimes.loads

    @property
    def misses_served(self) -> int:
        """Unknown keys / tenants answered from a recent miss, without a database read."""
        return self._keys.misses_served + self._by_id.misses_served + self._runtimes.misses_served

    @property
    def stale_served(self) -> int:
        """Answers given from last-known-good state while the database was unreachable."""
        return self._keys.stale_served + self._by_id.stale_served + self._runtimes.stale_served

    def oldest_read_age(self) -> float | None:
        """Seconds since the oldest cached entry was read (how stale an answer may be)."""
        tables = (self._keys, self._by_id, self._runtimes)
        ages = [t.oldest_read_age() for t in tables]
        known = [a for a in ages if a is not None]
        return max(known) if known else None

    async def identity(self, secret: str) -> KeyIdentity | None:
        digest = hashlib.sha256(secret.encode()).hexdigest()
        return await self._keys.get(digest, lambda: self._store.authenticate_key(secret))

    async def key(self, key_id: str) -> KeyIdentity | None:
        """A key by its id (a session token's issuer): None when unknown or revoked."""
        return await self._by_id.get(key_id, lambda: self._store.get_key_identity(key_id))

    async def runtime(self, tenant_id: str, *, refresh: bool = False) -> TenantRuntime | None:
        return await self._runtimes.get(
            tenant_id, lambda: self._store.get_tenant_runtime(tenant_id), refresh=refresh
        )

    async def _session_runtime(self, tenant_id: str) -> TenantRuntime | None:
        """The runtime a session token is checked against. Without a secret in the cached
        view, one re-read (the secret may have been created on another replica a moment ago),
        then none for ``miss_ttl_s`` while the tenant still has none: forged tokens naming it
        cost no more reads than that, and flush nothing."""
        rt = await self.runtime(tenant_id)
        if rt is None or rt.widget.session_secret is not None:
            return rt
        if self._no_secret.missing(tenant_id, self._clock()):
            return rt
        generation = self._no_secret.generation
        rt = await self.runtime(tenant_id, refresh=True)
        if rt is not None and rt.widget.session_secret is None:
            self._no_secret.add(tenant_id, self._clock(), generation)
        return rt

    def check_integrity(self) -> None:
        self._keys.check_integrity()
        self._by_id.check_integrity(lambda k: k.key_id)
        self._runtimes.check_integrity(lambda rt: rt.tenant_id)
        self._no_secret.check_integrity(self._clock())

    async def on_event(self, event: TenantChanged) -> None:
        """Act on exactly what changed (tenants/events.py): a revoked key is refused for good
        (during a database outage too) while the tenant's other keys keep their last-known-good
        state; a new status is applied to the cached runtime; a policy change (which may refuse
        traffic, and the event does not say how) is never answered stale; everything else
        (prompt, limits, display settings, key limits) only forces a re-read. An event without
        details (an older replica's) distrusts whatever its kind may have changed."""
        if event.kind == "admins":
            return  # admin principals: nothing a tenant key depends on
        tid = event.tenant_id
        self._forget_misses(event)
        if event.kind == "deleted":
            for table in (self._keys, self._by_id):
                table.drop(tid)
            self._runtimes.drop(tid)
        elif event.kind == "keys":
            self._on_key_event(event)
        elif event.kind == "updated":
            self._on_update(event)
        else:  # created, prompt, limits
            self._runtimes.expire(tid)

    def _forget_misses(self, event: TenantChanged) -> None:
        """Unknown ids an event may have made known are read again: any event of a tenant for
        its runtime; a key created, a tenant created or restored (or an event that does not
        say what it did) for every unknown key (a miss does not know its tenant)."""
        self._runtimes.forget_missing(event.tenant_id)
        if event.kind == "updated" and "secret" in event.groups:
            self._no_secret.forget(event.tenant_id)
        if _may_make_keys_known(event):
            self._keys.forget_missing()
            self._by_id.forget_missing()

    def _on_key_event(self, event: TenantChanged) -> None:
        tid, key_id = event.tenant_id, event.key_id
        if key_id is None:  # which key, and what happened to it, unknown
            self._keys.distrust(tid)
            self._by_id.distrust(tid)
            return

        def this_key(ident: KeyIdentity) -> bool:
            return ident.key_id == key_id

        if event.key_change == "revoked":  # permanent: no key is ever un-revoked
            self._keys.revoke_where(tid, this_key)
            self._by_id.revoke_where(tid, this_key)
            self._by_id.revoke(key_id)
        elif event.key_change in ("limits", "priority"):  # read again at the next use
            self._keys.expire_where(tid, this_key)
            self._by_id.expire_where(tid, this_key)
        # created: nothing cached can name a key created a moment ago

    def _on_update(self, event: TenantChanged) -> None:
        tid, groups = event.tenant_id, event.groups
        if "status" in groups and event.status is not None:
            status = event.status
            self._runtimes.revise(tid, lambda rt: dataclasses.replace(rt, status=status))
        if "secret" in groups:  # tokens signed with the old secret stop verifying at once
            self._runtimes.revise(tid, _without_session_secret)
        unspelled = "status" in groups and event.status is None
        if not groups or "policy" in groups or unspelled:
            self._runtimes.distrust(tid)
        else:  # status / secret already applied; profile and widget refuse nothing
            self._runtimes.expire(tid)

    async def authenticate(self, request: web.Request) -> Principal:
        """401 for a missing/unknown key, 403 for a suspended tenant or a wrong widget origin."""
        header = request.headers.get("Authorization", "")
        scheme, _, secret = header.partition(" ")
        if scheme.lower() != "bearer" or not secret.strip():
            raise ApiError(
                401,
                "missing API key: send 'Authorization: Bearer <key>'",
                type_="authentication_error",
                code="invalid_api_key",
            )
        if session_tokens.is_session_token(secret.strip()):
            return await self._session_principal(request, secret.strip())
        ident = await self.identity(secret.strip())
        if ident is None:
            raise _invalid_key()
        if ident.kind == "widget":
            origin = request.headers.get("Origin")
            if origin is None or origin not in ident.allowed_origins:
                raise _origin_not_allowed("this widget key is not allowed from this origin")
            request[CORS_ORIGIN] = origin
        if self._on_use is not None:
            self._on_use(ident.key_id)
        rt = _require_active(await self.runtime(ident.tenant_id))
        if ident.kind == "widget" and rt.widget.require_session:
            raise ApiError(
                403,
                "this tenant's widget needs an end-user session token, not the bare widget key",
                type_="permission_error",
                code="session_required",
            )
        return Principal(ident, rt)

    async def _session_principal(self, request: web.Request, token: str) -> Principal:
        """A widget session token (gateway/access/session_tokens.py): MAC under the tenant's secret,
        expiry, then the origin it was issued for; the tenant must be active."""
        try:
            rt = await self._session_runtime(session_tokens.peek_tenant(token))
            secret = rt.widget.session_secret if rt is not None else None
            claims = session_tokens.verify(token, secret, time.time())
        except session_tokens.SessionTokenError as exc:
            # Readable by the calling page (the body names no secret), so the widget can renew.
            _cors_for_error(request)
            code = "session_expired" if exc.expired else "invalid_session_token"
            raise ApiError(401, str(exc), type_="authentication_error", code=code) from None
        if request.headers.get("Origin") != claims.origin:
            _cors_for_error(request)
            raise _origin_not_allowed("this session token is not valid from this origin")
        request[CORS_ORIGIN] = claims.origin
        rt = _require_active(rt)
        issuer = await self.key(claims.key_id)
        if issuer is None or issuer.tenant_id != claims.tenant_id or issuer.kind != "server":
            _cors_for_error(request)
            raise ApiError(
                401,
                "the key that issued this session token is revoked",
                type_="authentication_error",
                code="invalid_session_token",
            )
        # The session's traffic counts against the issuing key's own limits too (its key scope).
        ident = dataclasses.replace(issuer, kind="widget", allowed_origins=(claims.origin,))
        return Principal(ident, rt, end_user_id=claims.end_user_id)


def _may_make_keys_known(event: TenantChanged) -> bool:
    if event.kind == "created":
        return True
    if event.kind == "keys":
        return event.key_change in (None, "created")
    if event.kind == "updated":  # a deleted tenant restored brings its keys back
        return not event.groups or "status" in event.groups
    return False


def _without_session_secret(rt: TenantRuntime) -> TenantRuntime:
    return dataclasses.replace(rt, widget=dataclasses.replace(rt.widget, session_secret=None))
