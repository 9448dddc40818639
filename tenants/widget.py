"""A tenant's widget settings and session-token secret (columns ``tenants.widget_*``,
``tenants.visitor_*``).

``WidgetStore`` runs each change in one transaction with its audit row, then publishes a
``TenantChanged`` so key caches drop the tenant's runtime view (which carries the policy and the
secret). Audit rows never hold the secret: a rotation records only that it happened.
"""

from __future__ import annotations

import contextlib
import secrets
from collections.abc import Awaitable, Callable, Iterator
from typing import Any, TypeVar

from sqlalchemy.ext.asyncio import AsyncSession

from tenants.db import is_unavailable, unavailable
from tenants.errors import TenantStoreError
from tenants.events import ChangeKind, TenantChanged
from tenants.models import Tenant, utcnow
from tenants.schemas import VisitorLimitsOut, WidgetSettingsIn, WidgetSettingsOut
from tenants.service import lock_tenant, write_audit
from tenants.store import TenantStore

T = TypeVar("T")

# Columns PUT .../widget replaces, by request field (visitor limits are nested in the request).
SETTING_COLUMNS = {
    "title": "widget_title",
    "greeting": "widget_greeting",
    "accent": "widget_accent",
    "require_session": "widget_require_session",
    "allow_client_system": "widget_allow_client_system",
}
VISITOR_COLUMNS = {
    "rpm": "visitor_rpm",
    "tpm": "visitor_tpm",
    "max_concurrency": "visitor_max_concurrency",
}


def new_session_secret() -> str:
    return secrets.token_hex(32)  # 256 bits, 64 hex chars (the column's width)


def widget_out(tenant: Tenant) -> WidgetSettingsOut:
    return WidgetSettingsOut(
        title=tenant.widget_title,
        greeting=tenant.widget_greeting,
        accent=tenant.widget_accent,
        require_session=tenant.widget_require_session,
        allow_client_system=tenant.widget_allow_client_system,
        visitor_limits=VisitorLimitsOut(
            rpm=tenant.visitor_rpm,
            tpm=tenant.visitor_tpm,
            max_concurrency=tenant.visitor_max_concurrency,
        ),
        session_secret_set=tenant.widget_session_secret is not None,
    )


def _columns(data: WidgetSettingsIn) -> dict[str, Any]:
    out = {col: getattr(data, name) for name, col in SETTING_COLUMNS.items()}
    visitor = data.visitor_limits
    for name, col in VISITOR_COLUMNS.items():
        out[col] = None if visitor is None else getattr(visitor, name)
    return out


async def set_widget(
    session: AsyncSession, tenant_id: str, data: WidgetSettingsIn, *, actor: str
) -> WidgetSettingsOut:
    """Replace every widget setting; no write and no audit row when nothing differs."""
    tenant = await lock_tenant(session, tenant_id, allow_deleted=False)
    after = _columns(data)
    before = {col: getattr(tenant, col) for col in after}
    if before != after:
        for col, value in after.items():
            setattr(tenant, col, value)
        tenant.updated_at = utcnow()
        await session.flush()
        await write_audit(
            session, actor, "widget.set", tenant_id, {"before": before, "after": after}
        )
    return widget_out(tenant)


async def get_widget(session: AsyncSession, tenant_id: str) -> WidgetSettingsOut:
    tenant = await session.get(Tenant, tenant_id)
    if tenant is None:
        await lock_tenant(session, tenant_id, allow_deleted=True)  # raises TenantNotFound
    assert tenant is not None
    return widget_out(tenant)


async def rotate_session_secret(
    session: AsyncSession, tenant_id: str, *, actor: str
) -> WidgetSettingsOut:
    """A new secret: every session token signed with the old one stops verifying."""
    tenant = await lock_tenant(session, tenant_id, allow_deleted=False)
    tenant.widget_session_secret = new_session_secret()
    tenant.updated_at = utcnow()
    await session.flush()
    await write_audit(session, actor, "widget.rotate_secret", tenant_id, {})
    return widget_out(tenant)


async def ensure_session_secret(
    session: AsyncSession, tenant_id: str, *, actor: str
) -> tuple[str, bool]:
    """(the tenant's session secret, created now): created on first use under the tenant's row
    lock, so concurrent first uses agree on one secret."""
    tenant = await lock_tenant(session, tenant_id, allow_deleted=False)
    if tenant.widget_session_secret is not None:
        return tenant.widget_session_secret, False
    tenant.widget_session_secret = new_session_secret()
    await session.flush()
    await write_audit(session, actor, "widget.create_secret", tenant_id, {})
    return tenant.widget_session_secret, True


@contextlib.contextmanager
def _outages_unavailable() -> Iterator[None]:
    try:
        yield
    except TenantStoreError:
        raise
    except Exception as exc:
        if is_unavailable(exc):
            raise unavailable(exc) from exc
        raise


class WidgetStore:
    """Widget settings on top of a ``TenantStore`` (its sessions and event bus)."""

    def __init__(self, store: TenantStore) -> None:
        self._store = store

    async def _write(self, fn: Callable[[AsyncSession], Awaitable[T]]) -> T:
        with _outages_unavailable():
            async with self._store.sessions() as session, session.begin():
                return await fn(session)

    async def _changed(self, tenant_id: str, kind: ChangeKind) -> None:
        await self._store.bus.publish(TenantChanged(tenant_id, kind, None))

    async def get(self, tenant_id: str) -> WidgetSettingsOut:
        with _outages_unavailable():
            async with self._store.sessions() as session:
                return await get_widget(session, tenant_id)

    async def set(self, tenant_id: str, data: WidgetSettingsIn, *, actor: str) -> WidgetSettingsOut:
        out = await self._write(lambda s: set_widget(s, tenant_id, data, actor=actor))
        # "updated": it may refuse traffic (require_session), so no replica may keep serving
        # the old settings from a stale cache.
        await self._changed(tenant_id, "updated")
        return out

    async def rotate_secret(self, tenant_id: str, *, actor: str) -> WidgetSettingsOut:
        out = await self._write(lambda s: rotate_session_secret(s, tenant_id, actor=actor))
        await self._changed(tenant_id, "updated")  # a revocation: never served stale
        return out

    async def session_secret(self, tenant_id: str, *, actor: str) -> str:
        """The secret, created on first use; a created one is announced so caches see it."""
        secret, created = await self._write(
            lambda s: ensure_session_secret(s, tenant_id, actor=actor)
        )
        if created:
            await self._changed(tenant_id, "limits")  # refuses nothing: an expiry is enough
        return secret
