"""API key -> tenant, cached in memory with a short TTL and acted on by tenant change events.

The cache key is the SHA-256 of the presented key (the key itself is never kept). Only
successful lookups are cached: a key created a moment ago must work at once. Runtime views
(status, limits, prompt version) are cached per tenant with the same TTL and invalidated by
events, so a suspension or a limit change applies at once on this replica and within the TTL
on replicas that miss the event. While the tenant database is unreachable, known keys and
tenants are served from their last-known-good state (gateway/lkg.py), for a bounded time.
"""

from __future__ import annotations

import dataclasses
import hashlib
import time
from collections.abc import Callable
from dataclasses import dataclass

from aiohttp import web

from gateway.errors import ApiError
from gateway.lkg import LastKnownGood
from gateway.widget import tokens
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
    ) -> None:
        self._store = store
        self._on_use = on_use  # key id -> None (records last use; no I/O)
        self._keys: LastKnownGood[KeyIdentity] = LastKnownGood(ttl_s, stale_max_s, clock)
        self._by_id: LastKnownGood[KeyIdentity] = LastKnownGood(ttl_s, stale_max_s, clock)
        self._runtimes: LastKnownGood[TenantRuntime] = LastKnownGood(ttl_s, stale_max_s, clock)
        self.stale_max_s = stale_max_s

    @property
    def lookups(self) -> int:
        """Database round trips attempted (tests check the cache works)."""
        return self._keys.loads + self._by_id.loads + self._runtimes.loads

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

    async def runtime(self, tenant_id: str) -> TenantRuntime | None:
        return await self._runtimes.get(
            tenant_id, lambda: self._store.get_tenant_runtime(tenant_id)
        )

    def check_integrity(self) -> None:
        self._keys.check_integrity()
        self._by_id.check_integrity(lambda k: k.key_id)
        self._runtimes.check_integrity(lambda rt: rt.tenant_id)

    def invalidate(self, tenant_id: str) -> None:
        """Re-read the tenant and its keys on next use (last-known-good still applies)."""
        self._keys.expire(tenant_id)
        self._by_id.expire(tenant_id)
        self._runtimes.expire(tenant_id)

    async def on_event(self, event: TenantChanged) -> None:
        """Act on exactly what changed (tenants/events.py): a revoked key is refused for good
        (during a database outage too) while the tenant's other keys keep their last-known-good
        state; a new status is applied to the cached runtime; a policy change (which may refuse
        traffic, and the event does not say how) is never answered stale; everything else
        (prompt, limits, display settings, key limits) only forces a re-read. An event without
        details (an older replica's) distrusts whatever its kind may have changed."""
        tid = event.tenant_id
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
        elif event.key_change == "limits":
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
        if tokens.is_session_token(secret.strip()):
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
        """A widget session token (gateway/widget/tokens.py): MAC under the tenant's secret,
        expiry, then the origin it was issued for; the tenant must be active."""
        try:
            tenant_id = tokens.peek_tenant(token)
            rt = await self.runtime(tenant_id)
            if rt is not None and rt.widget.session_secret is None:
                self.invalidate(tenant_id)  # the secret may have been created a moment ago
                rt = await self.runtime(tenant_id)
            secret = rt.widget.session_secret if rt is not None else None
            claims = tokens.verify(token, secret, time.time())
        except tokens.SessionTokenError as exc:
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


def _without_session_secret(rt: TenantRuntime) -> TenantRuntime:
    return dataclasses.replace(rt, widget=dataclasses.replace(rt.widget, session_secret=None))
