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

from tenants.errors import (
    KeyNotFound,
    PromptVersionNotFound,
    TenantDeleted,
    TenantExists,
    TenantNotFound,
)
from tenants.keys import generate_key
from tenants.models import ApiKey, AuditLog, SystemPrompt, Tenant, utcnow
from tenants.queries import tenant_out
from tenants.schemas import (
    KeyCreate,
    KeyCreated,
    KeyLimitsIn,
    KeyLimitsOut,
    KeyOut,
    KeyPriorityIn,
    LimitsIn,
    PromptActivated,
    TenantCreate,
    TenantOut,
    TenantPatch,
)
from tenants.tools import tools_digest

LIMIT_FIELDS = ("rpm", "tpm", "max_concurrency", "max_output_tokens", "weight")
KEY_LIMIT_FIELDS = ("rpm", "tpm", "max_concurrency")


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
        session.add(prompt_row(data.id, 1, data.system_prompt, actor))
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


def prompt_row(tenant_id: str, version: int, text: str, actor: str) -> SystemPrompt:
    return SystemPrompt(
        tenant_id=tenant_id,
        version=version,
        text=text,
        sha256=prompt_digest(text)["sha256"],
        created_at=utcnow(),
        created_by=actor,
    )


async def claim_tenant_row(session: AsyncSession, tenant_id: str) -> None:
    """The first write of a prompt change: an UPDATE of the tenant row, so concurrent changes
    queue on that row (PostgreSQL) or on the database write lock (SQLite). Statements after it
    see every change committed before it (a new snapshot per statement on PostgreSQL)."""
    claimed = await session.scalar(
        update(Tenant)
        .where(Tenant.id == tenant_id, Tenant.status != "deleted")
        .values(updated_at=utcnow())
        .returning(Tenant.id)
        .execution_options(synchronize_session=False)
    )
    if claimed is None:
        await lock_tenant(session, tenant_id, allow_deleted=False)  # raises the right error
        raise AssertionError("unreachable: tenant exists and is not deleted")


async def set_active_version(session: AsyncSession, tenant_id: str, version: int) -> None:
    await session.execute(
        update(Tenant)
        .where(Tenant.id == tenant_id)
        .values(active_prompt_version=version)
        .execution_options(synchronize_session=False)
    )


async def set_system_prompt(session: AsyncSession, tenant_id: str, text: str, *, actor: str) -> int:
    """Add a prompt version and make it the active one; returns the new version.

    The tenant row is claimed first (``claim_tenant_row``): concurrent calls serialize, each
    numbers its version after the newest committed one (which need not be the active one after
    a rollback), and the last to commit is active.
    """
    await claim_tenant_row(session, tenant_id)
    newest = await session.scalar(
        select(func.max(SystemPrompt.version)).where(SystemPrompt.tenant_id == tenant_id)
    )
    version = (newest or 0) + 1
    await set_active_version(session, tenant_id, version)
    session.add(prompt_row(tenant_id, version, text, actor))
    await session.flush()
    await write_audit(
        session, actor, "prompt.set", tenant_id, {"version": version, **prompt_digest(text)}
    )
    return version


async def activate_prompt(
    session: AsyncSession, tenant_id: str, version: int, *, actor: str
) -> PromptActivated:
    """Make an existing version the active one (rollback or roll forward). Activating the
    active version changes nothing and writes no audit row."""
    await claim_tenant_row(session, tenant_id)
    prompt = await session.get(SystemPrompt, (tenant_id, version))
    if prompt is None:
        raise PromptVersionNotFound(tenant_id, version)
    previous = await session.scalar(
        select(Tenant.active_prompt_version).where(Tenant.id == tenant_id)
    )
    if previous == version:
        return PromptActivated(version=version, previous_version=previous, changed=False)
    await set_active_version(session, tenant_id, version)
    details = {
        "version": version,
        "previous_version": previous,
        **prompt_digest(prompt.text),
        **tools_digest(prompt.tools),
    }
    await write_audit(session, actor, "prompt.activate", tenant_id, details)
    return PromptActivated(version=version, previous_version=previous, changed=True)


async def set_limits(
    session: AsyncSession, tenant_id: str, limits: LimitsIn, *, actor: str, replace: bool = True
) -> TenantOut:
    """``replace``: set all four limits (an omitted or null field means "the default from
    settings"); otherwise change only the fields ``limits`` was given (null included)."""
    tenant = await lock_tenant(session, tenant_id, allow_deleted=False)
    before = {name: getattr(tenant, name) for name in LIMIT_FIELDS}
    names = (
        LIMIT_FIELDS if replace else tuple(n for n in LIMIT_FIELDS if n in limits.model_fields_set)
    )
    for name in names:
        setattr(tenant, name, getattr(limits, name))
    tenant.updated_at = utcnow()
    await session.flush()
    after = {name: getattr(tenant, name) for name in LIMIT_FIELDS}
    await write_audit(session, actor, "limits.set", tenant_id, {"before": before, "after": after})
    return tenant_out(tenant)


async def create_key(
    session: AsyncSession, tenant_id: str, data: KeyCreate, *, actor: str
) -> KeyCreated:
    await lock_tenant(session, tenant_id, allow_deleted=False)
    new = generate_key()
    origins = list(data.allowed_origins)
    limits = (data.limits or KeyLimitsIn()).model_dump()
    session.add(
        ApiKey(
            id=new.id,
            tenant_id=tenant_id,
            kind=data.kind,
            prefix=new.prefix,
            secret_sha256=new.secret_sha256,
            allowed_origins=origins,
            created_at=utcnow(),
            priority=data.priority,
            **limits,
        )
    )
    await session.flush()
    details = {
        "key_id": new.id,
        "kind": data.kind,
        "prefix": new.prefix,
        "origins": origins,
        "limits": limits,
        "priority": data.priority,
    }
    await write_audit(session, actor, "key.create", tenant_id, details)
    return KeyCreated(
        id=new.id,
        kind=data.kind,
        prefix=new.prefix,
        allowed_origins=origins,
        limits=KeyLimitsOut(**limits),
        key=new.key,
    )


async def _tenant_key(session: AsyncSession, tenant_id: str, key_id: str) -> ApiKey:
    key = await session.scalar(
        select(ApiKey).where(ApiKey.id == key_id, ApiKey.tenant_id == tenant_id)
    )
    if key is None:
        raise KeyNotFound(key_id)
    return key


async def set_key_limits(
    session: AsyncSession, tenant_id: str, key_id: str, limits: KeyLimitsIn, *, actor: str
) -> KeyOut:
    """Replace a key's three limits (null: only the tenant's limit applies)."""
    await lock_tenant(session, tenant_id, allow_deleted=False)
    key = await _tenant_key(session, tenant_id, key_id)
    before = {name: getattr(key, name) for name in KEY_LIMIT_FIELDS}
    after = limits.model_dump()
    if before != after:
        for name, value in after.items():
            setattr(key, name, value)
        await session.flush()
        details = {"key_id": key_id, "before": before, "after": after}
        await write_audit(session, actor, "key.limits", tenant_id, details)
    return KeyOut.model_validate(key)


async def set_key_priority(
    session: AsyncSession, tenant_id: str, key_id: str, data: KeyPriorityIn, *, actor: str
) -> KeyOut:
    """Set the engine's priority class of a key's requests (interactive | batch)."""
    await lock_tenant(session, tenant_id, allow_deleted=False)
    key = await _tenant_key(session, tenant_id, key_id)
    before = key.priority
    if before != data.priority:
        key.priority = data.priority
        await session.flush()
        details = {"key_id": key_id, "before": before, "after": data.priority}
        await write_audit(session, actor, "key.priority", tenant_id, details)
    return KeyOut.model_validate(key)


async def revoke_key(session: AsyncSession, tenant_id: str, key_id: str, *, actor: str) -> KeyOut:
    """Revoke a key; idempotent (revoking a revoked key changes nothing, writes no audit row)."""
    await lock_tenant(session, tenant_id, allow_deleted=True)
    key = await _tenant_key(session, tenant_id, key_id)
    if key.revoked_at is None:
        key.revoked_at = utcnow()
        await session.flush()
        details = {"key_id": key_id, "kind": key.kind, "prefix": key.prefix}
        await write_audit(session, actor, "key.revoke", tenant_id, details)
    return KeyOut.model_validate(key)
