"""API key -> tenant, cached in memory with a short TTL and dropped on tenant change events.

The cache key is the SHA-256 of the presented key (the key itself is never kept). Only
successful lookups are cached: a key created a moment ago must work at once. Runtime views
(status, limits, prompt version) are cached per tenant with the same TTL and invalidated by
events, so a suspension or a limit change applies at once on this replica and within the TTL
on replicas that miss the event.
"""

from __future__ import annotations

import hashlib
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import TypeVar

from aiohttp import web

from gateway.errors import ApiError
from gateway.widget import tokens
from tenants.events import TenantChanged
from tenants.runtime import KeyIdentity, TenantRuntime
from tenants.store import TenantStore

CORS_ORIGIN = web.RequestKey("cors_origin", str)  # the checked Origin of a widget request

V = TypeVar("V")


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
    def __init__(
        self,
        store: TenantStore,
        ttl_s: float,
        clock: Callable[[], float] = time.monotonic,
        on_use: Callable[[str], None] | None = None,
    ) -> None:
        self._store = store
        self._on_use = on_use  # key id -> None (records last use; no I/O)
        self._ttl = ttl_s
        self._clock = clock
        self._keys: dict[str, tuple[KeyIdentity, float]] = {}  # sha256(key) -> identity, expiry
        self._runtimes: dict[str, tuple[TenantRuntime, float]] = {}
        self.lookups = 0  # database round trips (tests check the cache works)

    async def identity(self, secret: str) -> KeyIdentity | None:
        digest = hashlib.sha256(secret.encode()).hexdigest()
        return await self._cached(self._keys, digest, lambda: self._store.authenticate_key(secret))

    async def runtime(self, tenant_id: str) -> TenantRuntime | None:
        return await self._cached(
            self._runtimes, tenant_id, lambda: self._store.get_tenant_runtime(tenant_id)
        )

    async def _cached(
        self,
        table: dict[str, tuple[V, float]],
        key: str,
        load: Callable[[], Awaitable[V | None]],
    ) -> V | None:
        """A fresh entry of ``table``, else ``load()`` (one database round trip); only found
        values are cached, so a key or tenant created a moment ago is seen at once."""
        hit = table.get(key)
        now = self._clock()
        if hit is not None and hit[1] > now:
            return hit[0]
        self.lookups += 1
        value = await load()
        if value is None:
            table.pop(key, None)
            return None
        table[key] = (value, now + self._ttl)
        return value

    def check_integrity(self) -> None:
        for digest, (ident, expiry) in self._keys.items():
            assert len(digest) == 64 and ident.tenant_id, f"bad key entry {digest[:8]}"
            assert expiry > 0, f"bad expiry for key of {ident.tenant_id}"
        for tenant_id, (rt, _) in self._runtimes.items():
            assert rt.tenant_id == tenant_id, f"runtime of {rt.tenant_id} under {tenant_id}"

    def invalidate(self, tenant_id: str) -> None:
        self._runtimes.pop(tenant_id, None)
        for digest in [d for d, (i, _) in self._keys.items() if i.tenant_id == tenant_id]:
            del self._keys[digest]

    async def on_event(self, event: TenantChanged) -> None:
        self.invalidate(event.tenant_id)

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
        ident = KeyIdentity(claims.tenant_id, claims.key_id, "widget", (claims.origin,))
        return Principal(ident, rt, end_user_id=claims.end_user_id)
