"""Factories for tenant-store tests (also imported by tests/gateway/admin/test_admin*.py)."""

from __future__ import annotations

import secrets
from typing import Any

from sqlalchemy import text

from tenants.models import ALL_TABLES
from tenants.schemas import KeyCreate, TenantCreate
from tenants.store import TenantStore

ADMIN_TOKEN = "admin-token-for-tests-0123456789"


def unique_id(prefix: str = "t") -> str:
    return f"{prefix}-{secrets.token_hex(4)}"


async def make_tenant(
    store: TenantStore,
    tenant_id: str | None = None,
    *,
    name: str = "Acme",
    system_prompt: str | None = "You are a helpful assistant.",
    actor: str = "test",
    **fields: Any,
) -> str:
    tenant_id = tenant_id or unique_id()
    data = TenantCreate(id=tenant_id, name=name, system_prompt=system_prompt, **fields)
    await store.create_tenant(data, actor=actor)
    return tenant_id


async def make_key(
    store: TenantStore, tenant_id: str, kind: str = "server", origins: list[str] | None = None
) -> tuple[str, str]:
    """Create a key; returns (key id, key)."""
    created = await store.create_key(
        tenant_id, KeyCreate(kind=kind, allowed_origins=origins or []), actor="test"
    )
    return created.id, created.key


async def dump_tables(store: TenantStore) -> str:
    """Every row of every tenant-store table as one string (to scan for secrets)."""
    parts: list[str] = []
    async with store.sessions() as session:
        for table in ALL_TABLES:
            rows = await session.execute(text(f"SELECT * FROM {table}"))
            parts.extend(repr(tuple(row)) for row in rows)
    return "\n".join(parts)
