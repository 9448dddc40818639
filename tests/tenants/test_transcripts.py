"""Operators' transcripts (tenants/transcripts.py) on SQLite and PostgreSQL: every owner of one
tenant listed newest first and paged, one read with its items in order, another tenant's id not
found, an audit row for every list, read, delete and setting change, and the setting refusing
reads (no row written) while deletion still works."""

from __future__ import annotations

import pytest
from sqlalchemy import select

from tenants import transcripts as tr
from tenants.conversation_records import OwnerScope
from tenants.conversation_store import ConversationStore
from tenants.models import AuditLog
from tenants.store import TenantStore
from tests.tenants.factories import make_tenant
from tests.tenants.test_conversations import response


async def audit(store: TenantStore, tenant_id: str) -> list[tuple[str, str, dict[str, object]]]:
    async with store.sessions() as session:
        rows = await session.scalars(
            select(AuditLog).where(AuditLog.tenant_id == tenant_id).order_by(AuditLog.id)
        )
        return [(r.actor, r.action, r.details) for r in rows if r.action.startswith("transcripts")]


async def test_list_read_delete_and_the_setting(store: TenantStore) -> None:
    conv = ConversationStore(store)
    t1, t2 = await make_tenant(store), await make_tenant(store)
    alice, bob = OwnerScope(t1, "user:alice"), OwnerScope(t1, "addr:203.0.113.9")
    first = await conv.create_conversation(alice, {})
    await conv.save_response(response(alice, "hello", "hi there", conversation_id=first.id))
    await conv.save_response(response(alice, "and?", "more", conversation_id=first.id))
    second = await conv.create_conversation(bob, {})
    elsewhere = await conv.create_conversation(OwnerScope(t2, "user:alice"), {})

    page = await store.write(lambda s: tr.list_transcripts(s, t1, actor="ops"))
    assert [(c.id, c.end_user, c.owner_kind) for c in page.data] == [
        (second.id, "203.0.113.9", "addr"),
        (first.id, "alice", "user"),
    ]
    row = page.data[1]
    assert (row.turns, row.input_tokens, row.output_tokens, row.total_tokens) == (2, 20, 6, 26)
    one = await store.write(lambda s: tr.read_transcript(s, t1, first.id, actor="ops"))
    assert [(e.role, e.text) for e in one.entries] == [
        ("user", "hello"),
        ("assistant", "hi there"),
        ("user", "and?"),
        ("assistant", "more"),
    ]
    with pytest.raises(tr.TranscriptNotFound):
        await store.write(lambda s: tr.read_transcript(s, t1, elsewhere.id, actor="ops"))

    paged = await store.write(lambda s: tr.list_transcripts(s, t1, actor="ops", limit=1))
    assert [c.id for c in paged.data] == [second.id] and paged.next_cursor
    cursor = paged.next_cursor
    rest = await store.write(lambda s: tr.list_transcripts(s, t1, actor="ops", cursor=cursor))
    assert [c.id for c in rest.data] == [first.id] and rest.next_cursor is None
    mine = await store.write(
        lambda s: tr.list_transcripts(s, t1, actor="ops", end_user="user:alice")
    )
    assert [c.id for c in mine.data] == [first.id]

    await store.write(lambda s: tr.set_access(s, t1, False, actor="owner"))
    for read in (
        lambda s: tr.list_transcripts(s, t1, actor="ops"),
        lambda s: tr.read_transcript(s, t1, first.id, actor="ops"),
    ):
        with pytest.raises(tr.TranscriptsDisabled):
            await store.write(read)
    assert (await store.read(lambda s: tr.get_access(s, t1))).enabled is False
    assert (await store.read(lambda s: tr.get_access(s, t2))).enabled is True
    await store.write(lambda s: tr.delete_transcript(s, t1, first.id, actor="ops"))
    with pytest.raises(tr.TranscriptNotFound):
        await store.write(lambda s: tr.delete_transcript(s, t1, first.id, actor="ops"))

    rows = await audit(store, t1)
    assert [action for _, action, _ in rows] == [
        "transcripts.list",
        "transcripts.read",
        "transcripts.list",
        "transcripts.list",
        "transcripts.list",
        "transcripts.set_access",
        "transcripts.delete",
    ]
    assert rows[1] == (
        "ops",
        "transcripts.read",
        {"conversation_id": first.id, "owner": "user:alice"},
    )
    assert await audit(store, t2) == []


async def test_item_text_names_what_it_does_not_show() -> None:
    message = {
        "type": "message",
        "role": "user",
        "content": [
            {"type": "input_text", "text": "look: "},
            {"type": "input_image", "image_url": "x"},
        ],
    }
    assert tr.item_text(message) == "look: [input_image]"
    call = {"type": "function_call", "name": "lookup", "arguments": '{"id": 3}'}
    assert tr.item_text(call) == 'lookup({"id": 3})'
    assert tr.item_text({"type": "function_call_output", "output": "ok"}) == "ok"
