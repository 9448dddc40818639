"""Prompt versions with tools, the webhook signing secret and MCP servers (mutations and reads;
each takes an ``AsyncSession`` inside the caller's transaction, as tenants/service.py's do).

Audit rows describe tools by name and hash (``tools_digest``), never schemas, URLs' secrets,
bearer tokens or the signing secret. The signing secret is stored sealed (tenants/sealing.py):
sealed here when made, opened here when read; its clear value leaves this module only as the
answer that shows it once and as the key the webhook runner signs with.
"""

from __future__ import annotations

import secrets
from typing import Any

import structlog
from sqlalchemy import func, select, update
from sqlalchemy.ext.asyncio import AsyncSession

from tenants.carry import ActiveVersion, Carry, read_active_version
from tenants.events import TenantChanged
from tenants.models import McpServer, SystemPrompt, Tenant
from tenants.schemas import PromptSet, PromptVersion
from tenants.sealing import SecretBox, SecretUnreadable
from tenants.secret_store import seal
from tenants.service import (
    claim_tenant_row,
    lock_tenant,
    prompt_digest,
    prompt_row,
    set_active_version,
    write_audit,
)
from tenants.store import TenantStore
from tenants.tools import (
    InvalidTools,
    McpSource,
    ToolIn,
    WebhookSource,
    stored_tools,
    tools_digest,
)

log = structlog.get_logger(__name__)


def new_tool_secret() -> str:
    return secrets.token_hex(32)  # 256 bits, 64 hex chars (the column's width)


def tool_options(data: PromptSet) -> dict[str, Any] | None:
    options: dict[str, Any] = {}
    if data.tool_choice is not None:
        choice = data.tool_choice
        options["tool_choice"] = choice if isinstance(choice, str) else choice.model_dump()
    if data.max_tool_rounds is not None:
        options["max_tool_rounds"] = data.max_tool_rounds
    return options or None


def has_webhooks(data: PromptSet) -> bool:
    return any(isinstance(t.source, WebhookSource) for t in data.tools or [])


async def set_prompt_version(
    session: AsyncSession,
    tenant_id: str,
    data: PromptSet,
    *,
    actor: str,
    box: SecretBox | None,
    carry: Carry | None,
) -> PromptVersion:
    """Add a version (text, tools, options) and make it active; see ``set_system_prompt`` of
    tenants/service.py for the ordering of concurrent calls. ``carry``: what ``data`` took from
    the active version (tenants/carry.py), which must still be the active one. A version with
    webhook tools gives the tenant a signing secret if it has none (returned this once)."""
    await claim_tenant_row(session, tenant_id)
    if carry is not None:
        active = await session.scalar(
            select(Tenant.active_prompt_version).where(Tenant.id == tenant_id)
        )
        carry.check(tenant_id, active)
    tools = data.tools or []
    await _check_mcp_sources(session, tenant_id, tools)
    newest = await session.scalar(
        select(func.max(SystemPrompt.version)).where(SystemPrompt.tenant_id == tenant_id)
    )
    version = (newest or 0) + 1
    await set_active_version(session, tenant_id, version)
    row = prompt_row(tenant_id, version, data.text, actor)
    row.tools, row.tool_options = stored_tools(tools), tool_options(data)
    session.add(row)
    await session.flush()
    details = {"version": version, **prompt_digest(data.text), **tools_digest(row.tools)}
    if carry is not None:
        details.update(carry.audit())
    await write_audit(session, actor, "prompt.set", tenant_id, details)
    secret = None
    if has_webhooks(data):
        assert box is not None, "a version with webhook tools needs the secrets key"
        secret = await _ensure_tool_secret(session, tenant_id, actor, box)
    return PromptVersion(version=version, webhook_secret=secret)


async def _check_mcp_sources(session: AsyncSession, tenant_id: str, tools: list[ToolIn]) -> None:
    """A tool of an MCP server names a server of this tenant and a tool that server listed."""
    for i, tool in enumerate(tools):
        source = tool.source
        if not isinstance(source, McpSource):
            continue
        server = await session.get(McpServer, source.mcp)
        if server is None or server.tenant_id != tenant_id:  # another's is as unknown as none
            where = f"tools.{i}.source.mcp"
            raise InvalidTools(f"{where}: no MCP server {source.mcp!r} of this tenant", param=where)
        if tool.function.name not in {t["name"] for t in server.tools}:
            where = f"tools.{i}.function.name"
            msg = f"{where}: MCP server {source.mcp!r} lists no tool {tool.function.name!r}"
            raise InvalidTools(msg, param=where)


async def _ensure_tool_secret(
    session: AsyncSession, tenant_id: str, actor: str, box: SecretBox
) -> str | None:
    clear = new_tool_secret()
    made = await session.scalar(
        update(Tenant)
        .where(Tenant.id == tenant_id, Tenant.tool_secret.is_(None))
        .values(tool_secret=await seal(session, box, clear))
        .returning(Tenant.id)
        .execution_options(synchronize_session=False)
    )
    if made is None:
        return None
    await write_audit(session, actor, "tool_secret.create", tenant_id, {})
    return clear


async def rotate_tool_secret(
    session: AsyncSession, tenant_id: str, *, actor: str, box: SecretBox
) -> str:
    """A new signing secret (the old one stops at once); returned only here."""
    tenant = await lock_tenant(session, tenant_id, allow_deleted=False)
    clear = new_tool_secret()
    tenant.tool_secret = await seal(session, box, clear)
    await session.flush()
    await write_audit(session, actor, "tool_secret.rotate", tenant_id, {})
    return clear


async def read_tool_secret(session: AsyncSession, tenant_id: str, box: SecretBox) -> str | None:
    stored = await session.scalar(select(Tenant.tool_secret).where(Tenant.id == tenant_id))
    if stored is None:
        return None
    try:
        return box.unseal(stored)
    except SecretUnreadable:
        log.error("secret_unreadable", tenant=tenant_id, secret="tool_secret")
        raise


class ToolStore:
    """Prompt versions with tools and the signing secret on top of a ``TenantStore``."""

    def __init__(self, store: TenantStore) -> None:
        self._store = store

    async def active_version(self, tenant_id: str) -> ActiveVersion:
        """What a new version would carry forward (``TenantNotFound`` for an unknown id)."""
        return await self._store.read(lambda s: read_active_version(s, tenant_id))

    async def set_prompt(
        self, tenant_id: str, data: PromptSet, *, actor: str, carry: Carry | None = None
    ) -> PromptVersion:
        box = await self._store.secrets.box() if has_webhooks(data) else None
        out = await self._store.write(
            lambda s: set_prompt_version(s, tenant_id, data, actor=actor, box=box, carry=carry)
        )
        await self._store.bus.publish(TenantChanged(tenant_id, "prompt", out.version))
        return out

    async def rotate_secret(self, tenant_id: str, *, actor: str) -> str:
        box = await self._store.secrets.box()
        return await self._store.write(
            lambda s: rotate_tool_secret(s, tenant_id, actor=actor, box=box)
        )

    async def secret(self, tenant_id: str) -> str | None:
        """The clear signing secret (``SecretUnreadable``: no key of the ring opens it)."""
        box = await self._store.secrets.box()
        return await self._store.read(lambda s: read_tool_secret(s, tenant_id, box))
