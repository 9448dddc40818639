"""Admin principals: create (the token returned once), list, get, revoke, find by token hash.

Tokens are ``kva_`` + 43 URL-safe characters (256 random bits); only their SHA-256 is stored,
unique, so a token is found by its hash (an index lookup) and the caller then compares the
stored hash with ``hmac.compare_digest``. Every change writes an audit row in its transaction
and, once committed, publishes a ``TenantChanged(kind="admins")`` so that every gateway's
token cache forgets what it holds (tenants/events.py).
"""

from __future__ import annotations

import hashlib
import hmac
import secrets
from datetime import UTC, datetime

from sqlalchemy import select
from sqlalchemy.ext.asyncio import AsyncSession

from tenants.admin_schemas import PLATFORM, AdminCreate, AdminCreated, AdminOut, AdminStatus
from tenants.errors import AdminNotFound, InvalidField
from tenants.events import TenantChanged
from tenants.models import AdminPrincipal, Tenant, utcnow
from tenants.service import write_audit
from tenants.store import TenantStore

TOKEN_PREFIX = "kva_"
MAX_LISTED = 1000


def token_sha256(token: str) -> str:
    return hashlib.sha256(token.encode()).hexdigest()


def status_of(row: AdminPrincipal, now: datetime | None = None) -> AdminStatus:
    if row.revoked_at is not None:
        return "revoked"
    if row.expires_at is not None and row.expires_at <= (now or datetime.now(UTC)):
        return "expired"
    return "active"


def admin_out(row: AdminPrincipal) -> AdminOut:
    return AdminOut(
        id=row.id,
        scope=row.tenant_id or PLATFORM,
        access=row.access,  # type: ignore[arg-type]  # the CHECK constraint holds it
        name=row.name,
        created_at=row.created_at,
        created_by=row.created_by,
        expires_at=row.expires_at,
        revoked_at=row.revoked_at,
        status=status_of(row),
    )


async def _check_scope(session: AsyncSession, tenant_id: str | None) -> None:
    if tenant_id is None:
        return
    status = await session.scalar(select(Tenant.status).where(Tenant.id == tenant_id))
    if status is None or status == "deleted":
        raise InvalidField(f"scope: no tenant {tenant_id!r}", param="scope")


async def create_admin(session: AsyncSession, data: AdminCreate, *, actor: str) -> AdminCreated:
    await _check_scope(session, data.tenant_id)
    token = TOKEN_PREFIX + secrets.token_urlsafe(32)
    row = AdminPrincipal(
        id="adm_" + secrets.token_hex(8),
        token_sha256=token_sha256(token),
        tenant_id=data.tenant_id,
        access=data.access,
        name=data.name,
        created_at=utcnow(),
        created_by=actor,
        expires_at=data.expires_at,
    )
    session.add(row)
    await session.flush()
    details = {
        "admin_id": row.id,
        "scope": data.scope,
        "access": data.access,
        "name": data.name,
        "expires_at": data.expires_at.isoformat() if data.expires_at else None,
    }
    await write_audit(session, actor, "admin.create", data.tenant_id, details)
    return AdminCreated(**admin_out(row).model_dump(), token=token)


async def list_admins(session: AsyncSession, scope: str | None = None) -> list[AdminOut]:
    stmt = select(AdminPrincipal).order_by(AdminPrincipal.created_at.desc()).limit(MAX_LISTED)
    if scope == PLATFORM:
        stmt = stmt.where(AdminPrincipal.tenant_id.is_(None))
    elif scope is not None:
        stmt = stmt.where(AdminPrincipal.tenant_id == scope)
    return [admin_out(r) for r in (await session.execute(stmt)).scalars()]


async def _row(session: AsyncSession, admin_id: str) -> AdminPrincipal:
    row = await session.get(AdminPrincipal, admin_id)
    if row is None:
        raise AdminNotFound(admin_id)
    return row


async def get_admin(session: AsyncSession, admin_id: str) -> AdminOut:
    return admin_out(await _row(session, admin_id))


async def revoke_admin(session: AsyncSession, admin_id: str, *, actor: str) -> AdminOut:
    """Revoke (idempotent: an already revoked admin is returned as it is, no audit row)."""
    row = await _row(session, admin_id)
    if row.revoked_at is None:
        row.revoked_at = utcnow()
        await session.flush()
        details = {"admin_id": row.id, "scope": row.tenant_id or PLATFORM}
        await write_audit(session, actor, "admin.revoke", row.tenant_id, details)
    return admin_out(row)


async def find_by_token_hash(session: AsyncSession, digest: str) -> AdminOut | None:
    """The admin whose token hashes to ``digest`` (any status), compared in constant time;
    None also for the admins of a deleted tenant (they work again once it is restored)."""
    stmt = (
        select(AdminPrincipal, Tenant.status)
        .outerjoin(Tenant, Tenant.id == AdminPrincipal.tenant_id)
        .where(AdminPrincipal.token_sha256 == digest)
    )
    found = (await session.execute(stmt)).one_or_none()
    if found is None:
        return None
    row, tenant_status = found
    if not hmac.compare_digest(row.token_sha256.encode(), digest.encode()):
        return None
    return None if tenant_status == "deleted" else admin_out(row)


class AdminStore:
    """Admin principals on a ``TenantStore``: its transactions, deadline and event bus."""

    def __init__(self, store: TenantStore) -> None:
        self._store = store

    async def create(self, data: AdminCreate, *, actor: str) -> AdminCreated:
        return await self._store.write(lambda s: create_admin(s, data, actor=actor))

    async def list_all(self, scope: str | None = None) -> list[AdminOut]:
        return await self._store.read(lambda s: list_admins(s, scope))

    async def get(self, admin_id: str) -> AdminOut:
        return await self._store.read(lambda s: get_admin(s, admin_id))

    async def revoke(self, admin_id: str, *, actor: str) -> AdminOut:
        out = await self._store.write(lambda s: revoke_admin(s, admin_id, actor=actor))
        await self._store.bus.publish(TenantChanged(out.tenant_id or "", "admins"))
        return out

    async def by_digest(self, digest: str) -> AdminOut | None:
        """The admin of the token whose SHA-256 hex is ``digest`` (any status)."""
        return await self._store.read(lambda s: find_by_token_hash(s, digest))
