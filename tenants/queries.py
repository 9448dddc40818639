"""Admin read paths (each takes an ``AsyncSession``) and the store-wide integrity check.

Pagination is keyset-based: ``limit`` rows after ``cursor``; the page's ``next_cursor`` is the
cursor for the following page, ``None`` on the last page. Tenants are ordered by id (cursor = last
id); audit rows newest first (cursor = last row id).
"""

from __future__ import annotations

from sqlalchemy import func, select
from sqlalchemy.ext.asyncio import AsyncSession

from tenants.errors import InvalidField, PromptVersionNotFound, TenantNotFound
from tenants.models import TENANT_STATUSES, ApiKey, AuditLog, SystemPrompt, Tenant
from tenants.schemas import (
    AuditOut,
    AuditPage,
    KeyOut,
    LimitsOut,
    PromptOut,
    TenantOut,
    TenantPage,
)

MAX_PAGE = 200


def tenant_out(tenant: Tenant, keys: list[ApiKey] | None = None) -> TenantOut:
    return TenantOut(
        id=tenant.id,
        name=tenant.name,
        status=tenant.status,
        created_at=tenant.created_at,
        updated_at=tenant.updated_at,
        allow_client_system=tenant.allow_client_system,
        prompt_version=tenant.active_prompt_version,
        limits=LimitsOut(
            rpm=tenant.rpm,
            tpm=tenant.tpm,
            max_concurrency=tenant.max_concurrency,
            max_output_tokens=tenant.max_output_tokens,
            weight=tenant.weight,
        ),
        keys=None if keys is None else [KeyOut.model_validate(k) for k in keys],
        conversation_store=tenant.conversation_store,
        conversation_retention_days=tenant.conversation_retention_days,
        vllm_visitor_salt=tenant.vllm_visitor_salt,
    )


def check_limit(limit: int) -> int:
    if not 1 <= limit <= MAX_PAGE:
        raise InvalidField(f"limit must be between 1 and {MAX_PAGE}", param="limit")
    return limit


async def get_tenant(session: AsyncSession, tenant_id: str) -> TenantOut:
    """A tenant in any status, with its keys (revoked ones included)."""
    tenant = await _existing_tenant(session, tenant_id)
    keys = (
        await session.scalars(
            select(ApiKey).where(ApiKey.tenant_id == tenant_id).order_by(ApiKey.created_at)
        )
    ).all()
    return tenant_out(tenant, keys=list(keys))


async def list_tenants(
    session: AsyncSession, *, limit: int = 50, cursor: str | None = None, status: str | None = None
) -> TenantPage:
    """``status``: one of active/suspended/deleted, "all", or None (every status but deleted)."""
    check_limit(limit)
    stmt = select(Tenant).order_by(Tenant.id).limit(limit + 1)
    if status is None:
        stmt = stmt.where(Tenant.status != "deleted")
    elif status in TENANT_STATUSES:
        stmt = stmt.where(Tenant.status == status)
    elif status != "all":
        raise InvalidField("status must be active, suspended, deleted or all", param="status")
    if cursor:
        stmt = stmt.where(Tenant.id > cursor)
    rows = list((await session.scalars(stmt)).all())
    more = len(rows) > limit
    rows = rows[:limit]
    return TenantPage(data=[tenant_out(t) for t in rows], next_cursor=rows[-1].id if more else None)


def _prompt_out(prompt: SystemPrompt, active_version: int | None) -> PromptOut:
    return PromptOut(
        version=prompt.version,
        text=prompt.text,
        sha256=prompt.sha256,
        created_at=prompt.created_at,
        created_by=prompt.created_by,
        active=prompt.version == active_version,
        tools=prompt.tools,
        **(prompt.tool_options or {}),
    )


async def _existing_tenant(session: AsyncSession, tenant_id: str) -> Tenant:
    tenant = await session.get(Tenant, tenant_id)
    if tenant is None:
        raise TenantNotFound(tenant_id)
    return tenant


async def list_prompts(session: AsyncSession, tenant_id: str) -> list[PromptOut]:
    """Every prompt version of a tenant, newest first."""
    tenant = await _existing_tenant(session, tenant_id)
    rows = await session.scalars(
        select(SystemPrompt)
        .where(SystemPrompt.tenant_id == tenant_id)
        .order_by(SystemPrompt.version.desc())
    )
    return [_prompt_out(p, tenant.active_prompt_version) for p in rows]


async def get_prompt(session: AsyncSession, tenant_id: str, version: int) -> PromptOut:
    """One prompt version of a tenant (any status)."""
    tenant = await _existing_tenant(session, tenant_id)
    prompt = await session.get(SystemPrompt, (tenant_id, version))
    if prompt is None:
        raise PromptVersionNotFound(tenant_id, version)
    return _prompt_out(prompt, tenant.active_prompt_version)


async def list_keys(session: AsyncSession, tenant_id: str) -> list[KeyOut]:
    """Every key of a tenant (revoked ones included), oldest first; never a secret."""
    await _existing_tenant(session, tenant_id)
    keys = await session.scalars(
        select(ApiKey).where(ApiKey.tenant_id == tenant_id).order_by(ApiKey.created_at, ApiKey.id)
    )
    return [KeyOut.model_validate(k) for k in keys]


async def list_audit(
    session: AsyncSession,
    *,
    tenant_id: str | None = None,
    limit: int = 50,
    cursor: str | None = None,
) -> AuditPage:
    check_limit(limit)
    stmt = select(AuditLog).order_by(AuditLog.id.desc()).limit(limit + 1)
    if tenant_id is not None:
        stmt = stmt.where(AuditLog.tenant_id == tenant_id)
    if cursor:
        stmt = stmt.where(AuditLog.id < _audit_cursor(cursor))
    rows = list((await session.scalars(stmt)).all())
    more = len(rows) > limit
    rows = rows[:limit]
    return AuditPage(
        data=[AuditOut.model_validate(r) for r in rows],
        next_cursor=str(rows[-1].id) if more else None,
    )


def _audit_cursor(cursor: str) -> int:
    try:
        value = int(cursor)
    except ValueError:
        value = -1
    if not 0 < value < 2**63:
        raise InvalidField("cursor must be a cursor returned by this endpoint", param="cursor")
    return value


async def check_store_integrity(session: AsyncSession) -> None:
    """Raise AssertionError unless the versions of each tenant are exactly 1..n and its active
    version is one of them (NULL exactly when it has none)."""
    rows = await session.execute(
        select(
            Tenant.id,
            Tenant.active_prompt_version,
            func.count(SystemPrompt.version),
            func.max(SystemPrompt.version),
        )
        .outerjoin(SystemPrompt, SystemPrompt.tenant_id == Tenant.id)
        .group_by(Tenant.id, Tenant.active_prompt_version)
    )
    for tenant_id, active, count, newest in rows:
        assert (newest or 0) == count, f"{tenant_id}: {count} versions, newest is {newest}"
        if newest is None:
            assert active is None, f"{tenant_id}: active version {active} but no versions"
        else:
            assert active is not None and 1 <= active <= newest, (
                f"{tenant_id}: active version {active} not in 1..{newest}"
            )
