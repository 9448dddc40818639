"""Mutations of the tenant store. Each takes an ``AsyncSession`` inside a transaction the caller
owns (``async with session.begin()``): the change and its audit row commit together or not at all.
``TenantStore`` (tenants/store.py) wraps each call in one transaction and emits the event.

Audit ``details`` never hold secrets (keys, key hashes, cache salt) or prompt text: a prompt is
described by its sha256 and length.
"""

from __future__ import annotations

import hashlib
import secrets
from typing import Any

from sqlalchemy import func, select, update
from sqlalchemy.ext.asyncio import AsyncSession

from tenants.errors import KeyNotFound, TenantDeleted, TenantExists, TenantNotFound
from tenants.keys import generate_key
from tenants.models import ApiKey, AuditLog, SystemPrompt, Tenant, utcnow
from tenants.queries import tenant_out
from tenants.schemas import (
    KeyCreate,
    KeyCreated,
    KeyOut,
    LimitsIn,
    TenantCreate,
    TenantOut,
    TenantPatch,
)

LIMIT_FIELDS = ("rpm", "tpm", "max_concurrency", "max_output_tokens")


def prompt_digest(text: str) -> dict[str, Any]:
    return {"sha256": hashlib.sha256(text.encode()).hexdigest(), "length": len(text)}


async def write_audit(
    session: AsyncSession, actor: str, action: str, tenant_id: str | None, details: dict[str, Any]
) -> None:
    session.add(AuditLog(actor=actor, action=action, tenant_id=tenant_id, details=details))
    await session.flush()


async def lock_tenant(session: AsyncSession, tenant_id: str, *, allow_deleted: bool) -> Tenant:
    """Load a tenant for change (row lock on PostgreSQL; SQLite serializes writers anyway)."""
    tenant = (
        await session.execute(select(Tenant).where(Tenant.id == tenant_id).with_for_update())
    ).scalar_one_or_none()
    if tenant is None:
        raise TenantNotFound(tenant_id)
    if tenant.status == "deleted" and not allow_deleted:
        raise TenantDeleted(tenant_id)
    return tenant


async def create_tenant(session: AsyncSession, data: TenantCreate, *, actor: str) -> TenantOut:
    exists = await session.scalar(select(func.count()).where(Tenant.id == data.id))
    if exists:
        raise TenantExists(data.id)
    limits = data.limits or LimitsIn()
    now = utcnow()
    tenant = Tenant(
        id=data.id,
        name=data.name,
        status="active",
        created_at=now,
        updated_at=now,
        cache_salt=secrets.token_hex(16),
        allow_client_system=data.allow_client_system,
        active_prompt_version=1 if data.system_prompt else None,
        **{name: getattr(limits, name) for name in LIMIT_FIELDS},
    )
    session.add(tenant)
    await session.flush()
    details: dict[str, Any] = {
        "name": data.name,
        "allow_client_system": data.allow_client_system,
        "limits": limits.model_dump(),
    }
    if data.system_prompt:
        session.add(_prompt_row(data.id, 1, data.system_prompt, actor))
        details["prompt"] = {"version": 1, **prompt_digest(data.system_prompt)}
    await write_audit(session, actor, "tenant.create", data.id, details)
    return tenant_out(tenant, keys=[])


async def update_tenant(
    session: AsyncSession, tenant_id: str, patch: TenantPatch, *, actor: str
) -> TenantOut:
    # Restoring a deleted tenant is the one change allowed on it (status=active).
    tenant = await lock_tenant(session, tenant_id, allow_deleted=patch.status is not None)
    changes = {
        name: value
        for name, value in patch.model_dump(exclude_none=True).items()
        if getattr(tenant, name) != value
    }
    if not changes:  # nothing differs: no write, no audit row
        return tenant_out(tenant)
    before = {name: getattr(tenant, name) for name in changes}
    for name, value in changes.items():
        setattr(tenant, name, value)
    tenant.updated_at = utcnow()
    await session.flush()
    await write_audit(
        session, actor, "tenant.update", tenant_id, {"before": before, "after": changes}
    )
    return tenant_out(tenant)


async def delete_tenant(session: AsyncSession, tenant_id: str, *, actor: str) -> TenantOut:
    """Soft delete (status=deleted); the tenant's keys stop authenticating. Idempotent: a second
    delete changes nothing and writes no audit row."""
    tenant = await lock_tenant(session, tenant_id, allow_deleted=True)
    if tenant.status != "deleted":
        before = tenant.status
        tenant.status = "deleted"
        tenant.updated_at = utcnow()
        await session.flush()
        await write_audit(session, actor, "tenant.delete", tenant_id, {"before": before})
    return tenant_out(tenant)


def _prompt_row(tenant_id: str, version: int, text: str, actor: str) -> SystemPrompt:
    return SystemPrompt(
        tenant_id=tenant_id,
        version=version,
        text=text,
        sha256=prompt_digest(text)["sha256"],
        created_at=utcnow(),
        created_by=actor,
    )


async def set_system_prompt(session: AsyncSession, tenant_id: str, text: str, *, actor: str) -> int:
    """Add a prompt version and make it the active one; returns the new version.

    The version is taken by one atomic UPDATE ... RETURNING on the tenant row, the first write
    of the transaction: concurrent calls queue on that row (PostgreSQL) or on the database write
    lock (SQLite), so each gets the next number and the last to commit is active.
    """
    version = await session.scalar(
        update(Tenant)
        .where(Tenant.id == tenant_id, Tenant.status != "deleted")
        .values(
            active_prompt_version=func.coalesce(Tenant.active_prompt_version, 0) + 1,
            updated_at=utcnow(),
        )
        .returning(Tenant.active_prompt_version)
        .execution_options(synchronize_session=False)
    )
    if version is None:
        await lock_tenant(session, tenant_id, allow_deleted=False)  # raises the right error
        raise AssertionError("unreachable: tenant exists and is not deleted")
    session.add(_prompt_row(tenant_id, version, text, actor))
    await session.flush()
    await write_audit(
        session, actor, "prompt.set", tenant_id, {"version": version, **prompt_digest(text)}
    )
    return version


async def set_limits(
    session: AsyncSession, tenant_id: str, limits: LimitsIn, *, actor: str
) -> TenantOut:
    """Replace all four limits (an omitted or null field means "the default from settings")."""
    tenant = await lock_tenant(session, tenant_id, allow_deleted=False)
    before = {name: getattr(tenant, name) for name in LIMIT_FIELDS}
    for name in LIMIT_FIELDS:
        setattr(tenant, name, getattr(limits, name))
    tenant.updated_at = utcnow()
    await session.flush()
    await write_audit(
        session, actor, "limits.set", tenant_id, {"before": before, "after": limits.model_dump()}
    )
    return tenant_out(tenant)


async def create_key(
    session: AsyncSession, tenant_id: str, data: KeyCreate, *, actor: str
) -> KeyCreated:
    await lock_tenant(session, tenant_id, allow_deleted=False)
    new = generate_key()
    origins = list(data.allowed_origins)
    session.add(
        ApiKey(
            id=new.id,
            tenant_id=tenant_id,
            kind=data.kind,
            prefix=new.prefix,
            secret_sha256=new.secret_sha256,
            allowed_origins=origins,
            created_at=utcnow(),
        )
    )
    await session.flush()
    details = {"key_id": new.id, "kind": data.kind, "prefix": new.prefix, "origins": origins}
    await write_audit(session, actor, "key.create", tenant_id, details)
    return KeyCreated(
        id=new.id, kind=data.kind, prefix=new.prefix, allowed_origins=origins, key=new.key
    )


async def revoke_key(session: AsyncSession, tenant_id: str, key_id: str, *, actor: str) -> KeyOut:
    """Revoke a key; idempotent (revoking a revoked key changes nothing, writes no audit row)."""
    await lock_tenant(session, tenant_id, allow_deleted=True)
    key = await session.scalar(
        select(ApiKey).where(ApiKey.id == key_id, ApiKey.tenant_id == tenant_id)
    )
    if key is None:
        raise KeyNotFound(key_id)
    if key.revoked_at is None:
        key.revoked_at = utcnow()
        await session.flush()
        details = {"key_id": key_id, "kind": key.kind, "prefix": key.prefix}
        await write_audit(session, actor, "key.revoke", tenant_id, details)
    return KeyOut.model_validate(key)
