"""Operators' deletions of stored conversations (item 2) on SQLite and PostgreSQL: through
``kvgate tenants delete-conversation`` / ``delete-end-user`` (in-process, as the console script
runs) and ``ConversationAdmin``: only the named conversation or end user goes, each deletion
writes its audit row (ids and counts, never content), unknown ids are errors."""

from __future__ import annotations

import asyncio
import json
from collections.abc import Iterator
from pathlib import Path

import pytest

from gateway.cli import main
from tenants.conversation_admin import ConversationAdmin
from tenants.conversation_records import (
    ConversationNotFound,
    NewItem,
    OwnerScope,
    TenantScope,
    new_id,
)
from tenants.conversation_store import ConversationStore
from tenants.errors import TenantNotFound
from tenants.store import TenantStore
from tests.tenants.factories import make_tenant
from tests.tenants.fixtures import PG_URL_TEMPLATE, create_pg_database, drop_pg_database


def msg(text: str) -> NewItem:
    item_id = new_id("msg")
    return NewItem(item_id, "message", {"id": item_id, "type": "message", "content": text})


async def _seed(store: TenantStore) -> tuple[str, dict[str, str]]:
    tenant = await make_tenant(store)
    conv = ConversationStore(store)
    made = {}
    for owner in ("user:alice", "user:bob", "key:k1"):
        c = await conv.create_conversation(OwnerScope(tenant, owner), {}, [msg("private")])
        made[owner] = c.id
    return tenant, made


async def _owners(store: TenantStore, tenant: str) -> set[str]:
    page = await ConversationStore(store).list_conversations(TenantScope(tenant), limit=100)
    return {c.owner for c in page.conversations}


async def test_admin_deletions_are_scoped_and_audited(store: TenantStore) -> None:
    tenant, made = await _seed(store)
    admin = ConversationAdmin(store)
    purged = await admin.delete_owner(tenant, "user:alice", actor="ops")
    assert (purged.conversations, purged.items) == (1, 1)
    assert await _owners(store, tenant) == {"user:bob", "key:k1"}
    await admin.delete_conversation(tenant, made["key:k1"], actor="ops")
    assert await _owners(store, tenant) == {"user:bob"}
    with pytest.raises(ConversationNotFound):
        await admin.delete_conversation(tenant, made["key:k1"], actor="ops")
    other = await make_tenant(store)
    with pytest.raises(ConversationNotFound):  # bob's conversation is not the other tenant's
        await admin.delete_conversation(other, made["user:bob"], actor="ops")
    with pytest.raises(TenantNotFound):
        await admin.delete_owner("no-such-tenant", "user:bob", actor="ops")
    audit = await store.list_audit(tenant_id=tenant)
    actions = [(a.action, a.details) for a in reversed(audit.data)]
    deletions = [a for a in actions if a[0].startswith("conversation.")]
    assert deletions[0] == (
        "conversation.delete_owner",
        {"owner": "user:alice", "conversations": 1, "responses": 0, "items": 1},
    )
    assert deletions[1][0] == "conversation.delete"
    assert deletions[1][1]["conversation_id"] == made["key:k1"]
    assert "private" not in json.dumps([a[1] for a in actions])


@pytest.fixture(params=["sqlite", "postgresql"])
def cli_url(
    request: pytest.FixtureRequest, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> Iterator[str]:
    if request.param == "sqlite":
        url = f"sqlite+aiosqlite:///{tmp_path / 'cli.db'}"
        name = None
    else:
        name = create_pg_database()
        url = PG_URL_TEMPLATE.format(name=name)
    monkeypatch.setenv("KVGATE_DATABASE_URL", url)
    monkeypatch.delenv("KVGATE_REDIS_URL", raising=False)
    yield url
    if name is not None:
        drop_pg_database(name)


def test_cli_deletes_a_conversation_and_an_end_users_data(
    cli_url: str, capsys: pytest.CaptureFixture[str]
) -> None:
    assert main(["migrate"]) == 0

    async def seed() -> tuple[str, dict[str, str]]:
        store = TenantStore.open(cli_url)
        try:
            return await _seed(store)
        finally:
            await store.aclose()

    tenant, made = asyncio.run(seed())
    capsys.readouterr()
    assert main(["tenants", "delete-end-user", tenant, "alice"]) == 0
    out = json.loads(capsys.readouterr().out)
    assert out == {"deleted": True, "conversations": 1, "responses": 0, "items": 1}
    assert main(["tenants", "delete-conversation", tenant, made["user:bob"]]) == 0
    assert json.loads(capsys.readouterr().out)["conversations"] == 1
    assert main(["tenants", "delete-conversation", tenant, made["user:bob"]]) == 1
    assert "not found" in capsys.readouterr().err

    async def owners() -> set[str]:
        store = TenantStore.open(cli_url)
        try:
            return await _owners(store, tenant)
        finally:
            await store.aclose()

    assert asyncio.run(owners()) == {"key:k1"}
