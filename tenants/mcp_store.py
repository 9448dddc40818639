"""A tenant's MCP servers: the URL, the optional bearer token (stored sealed: tenants/sealing.py;
never returned or logged) and the snapshot of the tools the server listed when it was added."""

from __future__ import annotations

import secrets
from datetime import datetime
from typing import Any

import structlog
from pydantic import BaseModel, ConfigDict, Field, field_validator
from sqlalchemy import select
from sqlalchemy.ext.asyncio import AsyncSession

from tenants.models import McpServer, utcnow
from tenants.sealing import SecretBox, SecretUnreadable
from tenants.secret_store import seal
from tenants.service import lock_tenant, write_audit
from tenants.store import TenantStore
from tenants.tools import MAX_URL_CHARS

log = structlog.get_logger(__name__)


class McpServerIn(BaseModel):
    model_config = ConfigDict(extra="forbid", strict=True)

    url: str = Field(min_length=1, max_length=MAX_URL_CHARS)
    bearer: str | None = Field(default=None, min_length=1, max_length=4096)

    @field_validator("url")
    @classmethod
    def _absolute(cls, value: str) -> str:
        scheme, sep, rest = value.partition("://")
        if not sep or scheme.lower() not in ("https", "http") or not rest:
            raise ValueError("must be an absolute https:// URL")
        return value


class McpServerOut(BaseModel):
    id: str
    url: str
    tools: list[dict[str, Any]]
    created_at: datetime


class McpServerList(BaseModel):
    data: list[McpServerOut]


def _out(row: McpServer) -> McpServerOut:
    return McpServerOut(id=row.id, url=row.url, tools=row.tools, created_at=row.created_at)


async def add_server(
    session: AsyncSession,
    tenant_id: str,
    data: McpServerIn,
    tools: list[dict[str, Any]],
    *,
    actor: str,
    box: SecretBox,
) -> McpServerOut:
    await lock_tenant(session, tenant_id, allow_deleted=False)
    row = McpServer(
        id=f"mcp_{secrets.token_hex(8)}",
        tenant_id=tenant_id,
        url=data.url,
        bearer=None if data.bearer is None else await seal(session, box, data.bearer),
        tools=tools,
        created_at=utcnow(),
    )
    session.add(row)
    await session.flush()
    details = {"server_id": row.id, "tools": [t["name"] for t in tools]}
    await write_audit(session, actor, "mcp.add", tenant_id, details)
    return _out(row)


async def list_servers(session: AsyncSession, tenant_id: str) -> list[McpServerOut]:
    rows = await session.scalars(
        select(McpServer).where(McpServer.tenant_id == tenant_id).order_by(McpServer.created_at)
    )
    return [_out(r) for r in rows]


async def server_access(
    session: AsyncSession, tenant_id: str, server_id: str, box: SecretBox
) -> tuple[str, str | None] | None:
    """URL and clear bearer of the tenant's own server (another tenant's is None);
    ``SecretUnreadable`` when no key of the ring opens the bearer."""
    row = await session.get(McpServer, server_id)
    if row is None or row.tenant_id != tenant_id:
        return None
    if row.bearer is None:
        return row.url, None
    try:
        return row.url, box.unseal(row.bearer)
    except SecretUnreadable:
        log.error("secret_unreadable", tenant=tenant_id, secret="mcp_bearer", server=server_id)
        raise


class McpStore:
    def __init__(self, store: TenantStore) -> None:
        self._store = store

    async def add(
        self, tenant_id: str, data: McpServerIn, tools: list[dict[str, Any]], *, actor: str
    ) -> McpServerOut:
        box = await self._store.secrets.box()
        return await self._store.write(
            lambda s: add_server(s, tenant_id, data, tools, actor=actor, box=box)
        )

    async def list(self, tenant_id: str) -> list[McpServerOut]:
        await self._store.get_tenant(tenant_id)  # 404 for an unknown tenant
        return await self._store.read(lambda s: list_servers(s, tenant_id))

    async def access(self, tenant_id: str, server_id: str) -> tuple[str, str | None] | None:
        box = await self._store.secrets.box()
        return await self._store.read(lambda s: server_access(s, tenant_id, server_id, box))
