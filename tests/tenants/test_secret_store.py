"""Secrets at rest in the tenant store, on SQLite and PostgreSQL: MCP bearer tokens and tool
signing secrets are stored sealed and read back in clear where the tools code needs them; audit
rows and answers never hold them; the start-up key check claims a fresh database and refuses a
wrong key; rotation reseals everything; migration 0009 seals the clear values an older
database holds, and its downgrade opens them again."""

from __future__ import annotations

import asyncio
from typing import Any

import pytest
from sqlalchemy import text

from tenants.db import make_engine
from tenants.mcp_store import McpServerIn, McpStore
from tenants.migrate import migrate_engine
from tenants.schemas import PromptSet
from tenants.sealing import SecretBox, SecretsKeyError, SecretUnreadable
from tenants.secret_keys import SecretsSettings
from tenants.secret_store import check_key, reseal_all
from tenants.store import TenantStore
from tenants.tool_service import ToolStore
from tests.tenants.factories import make_tenant
from tests.tenants.fixtures import (
    PG_URL_TEMPLATE,
    SECRETS_KEY,
    create_pg_database,
    db_url,
    drop_pg_database,
    postgresql_url,
    sqlite_url,
    store,
)
from tests.tenants.test_migrations import fresh_url

__all__ = ["db_url", "fresh_url", "postgresql_url", "sqlite_url", "store"]

BEARER = "mcp-bearer-0123456789-clear"
NEW_KEY = "rotated-secrets-key-" + "c" * 32
WEBHOOK_TOOL: dict[str, Any] = {
    "type": "function",
    "function": {"name": "lookup", "parameters": {"type": "object"}},
    "source": {"webhook": "https://hooks.example.com/x"},
}


async def _column(s: TenantStore, sql: str) -> list[Any]:
    async with s.engine.connect() as conn:
        return list((await conn.execute(text(sql))).scalars())


async def _secrets_of(s: TenantStore) -> tuple[str, str]:
    """A tenant with a webhook tool's signing secret and an MCP server's bearer; their ids."""
    tenant = await make_tenant(s)
    made = await ToolStore(s).set_prompt(
        tenant, PromptSet(text="t", tools=[WEBHOOK_TOOL]), actor="test"
    )
    assert made.webhook_secret is not None
    added = await McpStore(s).add(
        tenant, McpServerIn(url="https://mcp.example.com/", bearer=BEARER), [], actor="test"
    )
    return made.webhook_secret, added.id


async def test_secrets_are_sealed_at_rest_and_read_back_in_clear(store: TenantStore) -> None:
    secret, server_id = await _secrets_of(store)
    tenant = (await _column(store, "SELECT id FROM tenants"))[0]
    stored = await _column(store, "SELECT tool_secret FROM tenants")
    bearers = await _column(store, "SELECT bearer FROM mcp_servers")
    for value in stored + bearers:
        assert value.startswith("kvs1:") and secret not in value and BEARER not in value
    assert await ToolStore(store).secret(tenant) == secret  # what the webhook runner signs with
    assert await McpStore(store).access(tenant, server_id) == ("https://mcp.example.com/", BEARER)
    rotated = await ToolStore(store).rotate_secret(tenant, actor="test")
    assert await ToolStore(store).secret(tenant) == rotated != secret
    assert rotated not in str(await _column(store, "SELECT tool_secret FROM tenants"))
    # neither audit rows nor answers carry them
    audit = str(await store.list_audit(tenant_id=tenant))
    listed = str(await McpStore(store).list(tenant)) + str(await store.get_tenant(tenant))
    for clear in (secret, rotated, BEARER):
        assert clear not in audit and clear not in listed
    assert "tool_secret.create" in audit and "mcp.add" in audit


async def test_a_fresh_database_is_claimed_and_a_wrong_key_refused(store: TenantStore) -> None:
    assert await _column(store, "SELECT fingerprint FROM secret_keys") == []
    mine = await store.secrets.box()  # what a gateway does at start
    assert await _column(store, "SELECT fingerprint FROM secret_keys") == [mine.current]
    other = SecretBox([NEW_KEY])
    with pytest.raises(SecretsKeyError, match=f"sealed under key {mine.current}, which the"):
        await store.write(lambda s: check_key(s, other))
    await store.write(lambda s: check_key(s, SecretBox([NEW_KEY, SECRETS_KEY])))  # rotating


async def test_rotation_reseals_everything_then_the_old_key_goes(store: TenantStore) -> None:
    secret, server_id = await _secrets_of(store)
    tenant = (await _column(store, "SELECT id FROM tenants"))[0]
    before = await _column(store, "SELECT bearer FROM mcp_servers")
    ring = SecretBox([NEW_KEY, SECRETS_KEY])
    done = await store.write(lambda s: reseal_all(s, ring))
    assert (done.tool_secrets, done.bearers, done.keys_dropped) == (1, 1, 1)
    assert await _column(store, "SELECT fingerprint FROM secret_keys") == [ring.current]
    assert await _column(store, "SELECT bearer FROM mcp_servers") != before
    new_only = TenantStore(store.sessions, secrets=SecretsSettings(keys=(NEW_KEY,)))
    assert await ToolStore(new_only).secret(tenant) == secret
    assert (await McpStore(new_only).access(tenant, server_id) or ("", ""))[1] == BEARER
    with pytest.raises(SecretsKeyError):  # the old key alone no longer starts a gateway
        await store.write(lambda s: check_key(s, SecretBox([SECRETS_KEY])))
    with pytest.raises(SecretUnreadable):  # nor reads a secret
        SecretBox([SECRETS_KEY]).unseal((await _column(store, "SELECT bearer FROM mcp_servers"))[0])


async def test_a_value_no_key_opens_fails_the_whole_rotation(store: TenantStore) -> None:
    await _secrets_of(store)
    before = await _column(store, "SELECT tool_secret FROM tenants")
    with pytest.raises(SecretUnreadable, match=r"tenant .*, tool_secret: a stored secret opens"):
        await store.write(lambda s: reseal_all(s, SecretBox([NEW_KEY])))
    assert await _column(store, "SELECT tool_secret FROM tenants") == before  # nothing written


async def _old_database(url: str) -> TenantStore:
    """A database at revision 0008 holding a clear tool secret and a clear MCP bearer."""
    engine = make_engine(url)
    await migrate_engine(engine, "upgrade", "0008_budget_soft_webhook")
    await engine.dispose()
    s = TenantStore.open(url)
    tenant = "old"
    async with s.engine.begin() as conn:
        # the row as 0008 knows it: the ORM's model holds columns of later revisions
        await conn.execute(
            text(
                "INSERT INTO tenants (id, name, status, created_at, updated_at, cache_salt,"
                " allow_client_system, tool_secret) VALUES (:t, :t, 'active', CURRENT_TIMESTAMP,"
                " CURRENT_TIMESTAMP, :salt, false, :v)"
            ),
            {"t": tenant, "salt": "s" * 64, "v": "c" * 64},
        )
        await conn.execute(
            text(
                "INSERT INTO mcp_servers (id, tenant_id, url, bearer, tools, created_at) "
                "VALUES ('mcp_1', :t, 'https://m.example.com/', :b, '[]', CURRENT_TIMESTAMP)"
            ),
            {"t": tenant, "b": BEARER},
        )
    return s


async def test_migration_seals_clear_values_and_downgrade_opens_them(fresh_url: str) -> None:
    s = await _old_database(fresh_url)
    key = SecretsSettings(keys=(SECRETS_KEY,))
    try:
        await migrate_engine(s.engine, "upgrade", "head", key)
        sealed = await _column(s, "SELECT tool_secret FROM tenants")
        bearers = await _column(s, "SELECT bearer FROM mcp_servers")
        box = SecretBox([SECRETS_KEY])
        assert box.unseal(sealed[0]) == "c" * 64 and box.unseal(bearers[0]) == BEARER
        assert await _column(s, "SELECT fingerprint FROM secret_keys") == [box.current]
        reader = TenantStore(s.sessions, secrets=key)
        assert await ToolStore(reader).secret("old") == "c" * 64
        with pytest.raises(SecretsKeyError):  # a gateway with another key does not start
            await s.write(lambda x: check_key(x, SecretBox([NEW_KEY])))
        await migrate_engine(s.engine, "downgrade", "0008_budget_soft_webhook", key)
        assert await _column(s, "SELECT tool_secret FROM tenants") == ["c" * 64]
        assert await _column(s, "SELECT bearer FROM mcp_servers") == [BEARER]
        await migrate_engine(s.engine, "upgrade", "head", key)  # and up again
        assert box.unseal((await _column(s, "SELECT bearer FROM mcp_servers"))[0]) == BEARER
    finally:
        await s.aclose()


async def test_migration_without_a_key_fails_clearly_and_changes_nothing(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """A PostgreSQL database with clear secrets and no KVGATE_SECRETS_KEY: one clear error, the
    schema and the values as they were (the fixtures' databases, with no secret stored, were
    migrated with no key at all)."""
    monkeypatch.delenv("KVGATE_SECRETS_KEY", raising=False)
    name = await asyncio.to_thread(create_pg_database)
    try:
        s = await _old_database(PG_URL_TEMPLATE.format(name=name))
        try:
            with pytest.raises(SecretsKeyError, match="required with a database other than"):
                await migrate_engine(s.engine, "upgrade", "head")
            assert await _column(s, "SELECT bearer FROM mcp_servers") == [BEARER]
            assert await _column(s, "SELECT version_num FROM alembic_version") == [
                "0008_budget_soft_webhook"
            ]
        finally:
            await s.aclose()
    finally:
        await asyncio.to_thread(drop_pg_database, name)
