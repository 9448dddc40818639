"""A tenant's widget settings and session-token secret (columns ``tenants.widget_*``,
``tenants.visitor_*``).

``WidgetStore`` runs each unit of work through ``TenantStore.read`` / ``write`` (the request
path's deadline, outage mapping and fail-fast rule): a change and its audit row commit in one
transaction, then a ``TenantChanged`` names the setting groups it touched, so key caches re-read
the tenant's runtime view (which carries the policy and the secret). Audit rows never hold the
secret: a rotation records only that it happened.
"""

from __future__ import annotations

import secrets
from typing import Any

from sqlalchemy import select, update
from sqlalchemy.ext.asyncio import AsyncSession

from tenants.events import SettingGroup, TenantChanged
from tenants.models import Tenant, utcnow
from tenants.schemas import VisitorLimitsOut, WidgetSettingsIn, WidgetSettingsOut
from tenants.service import lock_tenant, write_audit
from tenants.store import TenantStore

# Columns PUT .../widget replaces, by request field (visitor limits are nested in the request).
# Those of POLICY_COLUMNS may refuse traffic (setting group "policy"); the rest do not ("widget").
SETTING_COLUMNS = {
    "title": "widget_title",
    "greeting": "widget_greeting",
    "accent": "widget_accent",
    "require_session": "widget_require_session",
    "allow_client_system": "widget_allow_client_system",
    "max_choices": "widget_max_choices",
    "history": "widget_history",
}
VISITOR_COLUMNS = {
    "rpm": "visitor_rpm",
    "tpm": "visitor_tpm",
    "max_concurrency": "visitor_max_concurrency",
}

# A lower max_choices refuses requests that were served: a policy change too.
POLICY_COLUMNS = frozenset(
    {"widget_require_session", "widget_allow_client_system", "widget_max_choices"}
)


def new_session_secret() -> str:
    return secrets.token_hex(32)  # 256 bits, 64 hex chars (the column's width)


def widget_out(tenant: Tenant) -> WidgetSettingsOut:
    return WidgetSettingsOut(
        title=tenant.widget_title,
        greeting=tenant.widget_greeting,
        accent=tenant.widget_accent,
        require_session=tenant.widget_require_session,
        allow_client_system=tenant.widget_allow_client_system,
        max_choices=tenant.widget_max_choices,
        visitor_limits=VisitorLimitsOut(
            rpm=tenant.visitor_rpm,
            tpm=tenant.visitor_tpm,
            max_concurrency=tenant.visitor_max_concurrency,
        ),
        session_secret_set=tenant.widget_session_secret is not None,
        history=tenant.widget_history,
    )


def _columns(data: WidgetSettingsIn) -> dict[str, Any]:
    out = {col: getattr(data, name) for name, col in SETTING_COLUMNS.items()}
    visitor = data.visitor_limits
    for name, col in VISITOR_COLUMNS.items():
        out[col] = None if visitor is None else getattr(visitor, name)
    return out


async def set_widget(
    session: AsyncSession, tenant_id: str, data: WidgetSettingsIn, *, actor: str
) -> tuple[WidgetSettingsOut, tuple[SettingGroup, ...]]:
    """Replace every widget setting; returns the settings and the groups that changed (none:
    no write and no audit row)."""
    tenant = await lock_tenant(session, tenant_id, allow_deleted=False)
    after = _columns(data)
    before = {col: getattr(tenant, col) for col in after}
    changed = {col for col in after if before[col] != after[col]}
    if changed:
        for col, value in after.items():
            setattr(tenant, col, value)
        tenant.updated_at = utcnow()
        await session.flush()
        await write_audit(
            session, actor, "widget.set", tenant_id, {"before": before, "after": after}
        )
    return widget_out(tenant), _groups(changed)


def _groups(columns: set[str]) -> tuple[SettingGroup, ...]:
    groups: list[SettingGroup] = []
    if columns & POLICY_COLUMNS:
        groups.append("policy")
    if columns - POLICY_COLUMNS:
        groups.append("widget")
    return tuple(groups)


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


async def read_session_secret(session: AsyncSession, tenant_id: str) -> str | None:
    """The secret of a tenant that is not deleted, or None (none yet, or no such tenant)."""
    return await session.scalar(
        select(Tenant.widget_session_secret).where(
            Tenant.id == tenant_id, Tenant.status != "deleted"
        )
    )


async def ensure_session_secret(
    session: AsyncSession, tenant_id: str, *, actor: str
) -> tuple[str, bool]:
    """(the tenant's session secret, created now). A conditional UPDATE (only where there is
    none yet): concurrent first uses, on any replica, agree on the one that committed first
    (the others' UPDATE waits for it, then matches no row, and they read its secret)."""
    created = await session.scalar(
        update(Tenant)
        .where(
            Tenant.id == tenant_id,
            Tenant.status != "deleted",
            Tenant.widget_session_secret.is_(None),
        )
        .values(widget_session_secret=new_session_secret())
        .returning(Tenant.widget_session_secret)
        .execution_options(synchronize_session=False)
    )
    if created is not None:
        await write_audit(session, actor, "widget.create_secret", tenant_id, {})
        return created, True
    existing = await read_session_secret(session, tenant_id)
    if existing is None:
        await lock_tenant(session, tenant_id, allow_deleted=False)  # raises the right error
        raise AssertionError("unreachable: a live tenant without a secret after the update")
    return existing, False


class WidgetStore:
    """Widget settings on top of a ``TenantStore``: its units of work and its event bus."""

    def __init__(self, store: TenantStore) -> None:
        self._store = store

    async def _changed(self, tenant_id: str, *groups: SettingGroup) -> None:
        event = TenantChanged(tenant_id, "updated", groups=groups)
        await self._store.bus.publish(event)

    async def get(self, tenant_id: str) -> WidgetSettingsOut:
        return await self._store.read(lambda s: get_widget(s, tenant_id))

    async def set(self, tenant_id: str, data: WidgetSettingsIn, *, actor: str) -> WidgetSettingsOut:
        out, groups = await self._store.write(lambda s: set_widget(s, tenant_id, data, actor=actor))
        if groups:  # "policy" may refuse traffic (require_session): never served stale
            await self._changed(tenant_id, *groups)
        return out

    async def rotate_secret(self, tenant_id: str, *, actor: str) -> WidgetSettingsOut:
        out = await self._store.write(lambda s: rotate_session_secret(s, tenant_id, actor=actor))
        await self._changed(tenant_id, "secret")  # a revocation of every token
        return out

    async def session_secret(self, tenant_id: str, *, actor: str) -> str:
        """The secret, created on first use (a read first: no write once it exists); a created
        one is announced so caches see it."""
        existing = await self._store.read(lambda s: read_session_secret(s, tenant_id))
        if existing is not None:
            return existing
        secret, created = await self._store.write(
            lambda s: ensure_session_secret(s, tenant_id, actor=actor)
        )
        if created:
            await self._changed(tenant_id, "secret")
        return secret
