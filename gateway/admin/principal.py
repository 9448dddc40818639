"""Who is calling the admin API: a ``Principal``, and the cache that maps tokens to principals.

A token is known by its SHA-256 only. The bootstrap token (KVGATE_ADMIN_TOKEN) is the platform
editor ``admin``; any other token is looked up in ``admin_principals`` by its hash (the store
then compares the stored hash in constant time, tenants/admins.py). Answers are cached for
``ttl_s`` (misses too, so a flood of wrong tokens costs one query per token and TTL); a revoked
or expired principal, or the admin of a deleted tenant, is refused at once on this replica
(``forget`` on every ``admins`` event and tenant deletion or restore, local or bridged) and
within ``ttl_s`` on a replica that missed the event.
"""

from __future__ import annotations

import hmac
import time
from dataclasses import dataclass
from datetime import UTC, datetime

from tenants.admin_schemas import Access, AdminOut
from tenants.admins import AdminStore, token_sha256
from tenants.events import TenantChanged

BOOTSTRAP_ID = "admin"  # the audit actor of the bootstrap token, as before principals existed


@dataclass(frozen=True)
class Principal:
    id: str
    tenant_id: str | None  # None: a platform admin
    access: Access
    expires_at: datetime | None = None

    @property
    def platform(self) -> bool:
        return self.tenant_id is None

    @property
    def editor(self) -> bool:
        return self.access == "editor"

    @property
    def scope(self) -> str:
        return self.tenant_id or "platform"

    def live(self, now: datetime | None = None) -> bool:
        return self.expires_at is None or (now or datetime.now(UTC)) < self.expires_at


BOOTSTRAP = Principal(BOOTSTRAP_ID, None, "editor")


def principal_of(admin: AdminOut) -> Principal | None:
    """The principal of an active admin row (None: revoked or expired)."""
    if admin.status != "active":
        return None
    return Principal(admin.id, admin.tenant_id, admin.access, admin.expires_at)


class PrincipalCache:
    """Token digest -> principal, each answer kept ``ttl_s``; at most ``max_entries``."""

    def __init__(
        self,
        admins: AdminStore,
        bootstrap_sha256: str | None,
        *,
        ttl_s: float = 5.0,
        max_entries: int = 4096,
    ) -> None:
        self._admins = admins
        self._bootstrap = bootstrap_sha256.encode() if bootstrap_sha256 else None
        self._ttl_s = ttl_s
        self._max = max_entries
        self._entries: dict[str, tuple[Principal | None, float]] = {}

    async def resolve(self, token: str) -> Principal | None:
        return await self.resolve_digest(token_sha256(token))

    async def resolve_digest(self, digest: str) -> Principal | None:
        if self._bootstrap is not None and hmac.compare_digest(digest.encode(), self._bootstrap):
            return BOOTSTRAP
        now = time.monotonic()
        hit = self._entries.get(digest)
        if hit is not None and now - hit[1] < self._ttl_s:
            principal = hit[0]
        else:
            found = await self._admins.by_digest(digest)
            principal = None if found is None else principal_of(found)
            self._remember(digest, principal, now)
        return principal if principal is not None and principal.live() else None

    def _remember(self, digest: str, principal: Principal | None, now: float) -> None:
        if len(self._entries) >= self._max:
            self._entries.clear()  # bounded: a flood of tokens costs re-reads, not memory
        self._entries[digest] = (principal, now)

    def forget(self) -> None:
        self._entries.clear()

    async def on_event(self, event: TenantChanged) -> None:
        """An admin changed somewhere (this replica or another), or a tenant was deleted or
        restored (its admins go and come with it): re-read every token."""
        status_change = event.kind == "updated" and (not event.exact or "status" in event.groups)
        if event.kind in ("admins", "deleted") or status_change:
            self.forget()
