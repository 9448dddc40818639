"""The conversation store on SQLite and PostgreSQL: scoping (another tenant or owner gets "not
found"), items in order and paged, the chain behind previous_response_id, tails, deletion of
one conversation, of a response and of everything one end user stored, and retention."""

from __future__ import annotations

from datetime import timedelta

import pytest
from sqlalchemy import update

from tenants.conversation_models import ConversationRow, ResponseRow
from tenants.conversation_records import (
    ConversationNotFound,
    ItemNotFound,
    NewItem,
    NewResponse,
    OwnerGone,
    OwnerScope,
    ResponseNotFound,
    Tail,
    TenantScope,
    new_id,
)
from tenants.conversation_store import ConversationStore
from tenants.models import Tenant, utcnow
from tenants.store import TenantStore
from tests.tenants.factories import make_tenant


def msg(text: str, role: str = "user") -> NewItem:
    item_id = new_id("msg")
    data = {"id": item_id, "type": "message", "role": role, "content": text}
    return NewItem(item_id, "message", data)


def response(
    scope: OwnerScope,
    text: str,
    answer: str,
    *,
    conversation_id: str | None = None,
    previous: str | None = None,
    tail: Tail | None = None,
) -> NewResponse:
    return NewResponse(
        id=new_id("resp"),
        scope=scope,
        model="m",
        status="completed",
        created_at=utcnow(),
        body={"object": "response", "output_text": answer},
        inputs=(msg(text),),
        outputs=(msg(answer, "assistant"),),
        conversation_id=conversation_id,
        previous_response_id=previous,
        input_tokens=10,
        output_tokens=3,
        tail=tail,
    )


def texts(items: tuple[object, ...]) -> list[str]:
    return [i.data["content"] for i in items]  # type: ignore[attr-defined]


@pytest.fixture
async def conv(store: TenantStore) -> ConversationStore:
    return ConversationStore(store)


async def test_conversation_scoped_to_tenant_and_owner(
    store: TenantStore, conv: ConversationStore
) -> None:
    t1, t2 = await make_tenant(store), await make_tenant(store)
    alice, bob = OwnerScope(t1, "user:alice"), OwnerScope(t1, "user:bob")
    made = await conv.create_conversation(alice, {"topic": "x"}, [msg("hi")])
    assert (await conv.get_conversation(alice, made.id)).metadata == {"topic": "x"}
    for other in (bob, OwnerScope(t2, "user:alice"), TenantScope(t2)):
        with pytest.raises(ConversationNotFound):
            await conv.get_conversation(other, made.id)
        with pytest.raises(ConversationNotFound):
            await conv.list_items(other, made.id)
        with pytest.raises(ConversationNotFound):
            await conv.delete_conversation(other, made.id)
    with pytest.raises(ConversationNotFound):
        await conv.append_items(bob, made.id, [msg("intrude")])
    # The operator's scope sees every owner of its tenant.
    assert (await conv.get_conversation(TenantScope(t1), made.id)).owner == "user:alice"
    assert [c.id for c in (await conv.list_conversations(alice)).conversations] == [made.id]
    assert (await conv.list_conversations(bob)).conversations == ()


async def test_items_in_order_and_paged(store: TenantStore, conv: ConversationStore) -> None:
    scope = OwnerScope(await make_tenant(store), "key:k1")
    made = await conv.create_conversation(scope, {}, [msg("a"), msg("b")])
    await conv.append_items(scope, made.id, [msg("c"), msg("d"), msg("e")])
    history = await conv.conversation_history(scope, made.id)
    assert texts(history) == ["a", "b", "c", "d", "e"]
    first = await conv.list_items(scope, made.id, limit=2, order="asc")
    assert texts(first.items) == ["a", "b"] and first.has_more
    rest = await conv.list_items(scope, made.id, limit=5, order="asc", after=first.items[-1].id)
    assert texts(rest.items) == ["c", "d", "e"] and not rest.has_more
    newest = await conv.list_items(scope, made.id, limit=2)
    assert texts(newest.items) == ["e", "d"]
    item = history[2]
    assert (await conv.get_item(scope, made.id, item.id)).data == item.data
    await conv.delete_item(scope, made.id, item.id)
    with pytest.raises(ItemNotFound):
        await conv.get_item(scope, made.id, item.id)
    assert texts(await conv.conversation_history(scope, made.id)) == ["a", "b", "d", "e"]


async def test_responses_chain_and_tail(store: TenantStore, conv: ConversationStore) -> None:
    tenant = await make_tenant(store)
    scope = OwnerScope(tenant, "user:u")
    tail = Tail("d" * 64, (1, 2, 3, 2**32 - 1))
    first = await conv.save_response(response(scope, "q1", "a1", tail=tail))
    second = await conv.save_response(response(scope, "q2", "a2", previous=first.id))
    got = await conv.get_response(scope, first.id)
    assert got.tail == tail and got.body["output_text"] == "a1"
    assert texts(await conv.response_history(scope, second.id)) == ["q1", "a1", "q2", "a2"]
    inputs = await conv.list_input_items(scope, second.id)
    assert texts(inputs.items) == ["q2"]
    other = OwnerScope(tenant, "user:v")
    for call in (conv.get_response, conv.response_history, conv.list_input_items):
        with pytest.raises(ResponseNotFound):
            await call(other, second.id)  # type: ignore[operator]
    await conv.delete_response(scope, first.id)
    with pytest.raises(ResponseNotFound):
        await conv.get_response(scope, first.id)
    # A chain whose start was deleted continues from what is still stored.
    assert texts(await conv.response_history(scope, second.id)) == ["q2", "a2"]


async def test_response_in_conversation(store: TenantStore, conv: ConversationStore) -> None:
    scope = OwnerScope(await make_tenant(store), "user:u")
    made = await conv.create_conversation(scope, {}, [msg("context")])
    r1 = await conv.save_response(response(scope, "q1", "a1", conversation_id=made.id))
    r2 = await conv.save_response(response(scope, "q2", "a2", conversation_id=made.id))
    got = await conv.get_conversation(scope, made.id)
    assert (got.turns, got.input_tokens, got.output_tokens) == (2, 20, 6)
    assert got.last_response_id == r2.id
    assert texts(await conv.conversation_history(scope, made.id)) == [
        *["context", "q1", "a1", "q2", "a2"]
    ]
    # Deleting a response keeps what it added to the conversation.
    await conv.delete_response(scope, r2.id)
    assert len(await conv.conversation_history(scope, made.id)) == 5
    assert (await conv.get_conversation(scope, made.id)).last_response_id is None
    purged = await conv.delete_conversation(scope, made.id)
    assert (purged.conversations, purged.responses, purged.items) == (1, 1, 5)
    with pytest.raises(ResponseNotFound):
        await conv.get_response(scope, r1.id)


async def test_delete_owner_removes_only_that_end_user(
    store: TenantStore, conv: ConversationStore
) -> None:
    t1, t2 = await make_tenant(store), await make_tenant(store)
    alice, bob = OwnerScope(t1, "user:a"), OwnerScope(t1, "user:b")
    alice2 = OwnerScope(t2, "user:a")
    kept: list[str] = []
    for scope in (alice, bob, alice2):
        c = await conv.create_conversation(scope, {}, [msg("x")])
        await conv.save_response(response(scope, "q", "a", conversation_id=c.id))
        r = await conv.save_response(response(scope, "q", "a"))
        if scope is not alice:
            kept += [c.id, r.id]
    purged = await conv.delete_owner(t1, "user:a")
    assert (purged.conversations, purged.responses, purged.items) == (1, 2, 5)
    assert (await conv.list_conversations(alice)).conversations == ()
    for scope, cid, rid in ((bob, kept[0], kept[1]), (alice2, kept[2], kept[3])):
        await conv.get_conversation(scope, cid)
        await conv.get_response(scope, rid)


async def test_retention_per_tenant(store: TenantStore, conv: ConversationStore) -> None:
    short, default = await make_tenant(store), await make_tenant(store)
    async with store.sessions() as session, session.begin():
        await session.execute(
            update(Tenant).where(Tenant.id == short).values(conversation_retention_days=1)
        )
    made: dict[str, tuple[str, str]] = {}
    for tenant in (short, default):
        scope = OwnerScope(tenant, "user:u")
        c = await conv.create_conversation(scope, {}, [msg("x")])
        r = await conv.save_response(response(scope, "q", "a"))
        made[tenant] = (c.id, r.id)
    two_days_ago = utcnow() - timedelta(days=2)
    async with store.sessions() as session, session.begin():
        await session.execute(update(ConversationRow).values(updated_at=two_days_ago))
        await session.execute(update(ResponseRow).values(created_at=two_days_ago))
    # Default 30 days keeps the default tenant's; the override of 1 day drops the other's.
    purged = await conv.purge_expired(utcnow(), 30)
    assert (purged.conversations, purged.responses) == (1, 1)
    with pytest.raises(ConversationNotFound):
        await conv.get_conversation(TenantScope(short), made[short][0])
    with pytest.raises(ResponseNotFound):
        await conv.get_response(TenantScope(short), made[short][1])
    await conv.get_conversation(TenantScope(default), made[default][0])
    # No default: kept unless the tenant sets a retention.
    assert (await conv.purge_expired(utcnow(), None)).conversations == 0
    assert (await conv.purge_expired(utcnow() + timedelta(days=40), 30)).conversations == 1


async def test_tenant_deletion_takes_its_conversations(
    store: TenantStore, conv: ConversationStore
) -> None:
    """A tenant row removed (hard) takes every row it owns (foreign keys, both backends)."""
    tenant = await make_tenant(store)
    scope = OwnerScope(tenant, "user:u")
    c = await conv.create_conversation(scope, {}, [msg("x")])
    await conv.save_response(response(scope, "q", "a", conversation_id=c.id))
    async with store.sessions() as session, session.begin():
        await session.delete(await session.get(Tenant, tenant))
    assert (await conv.list_conversations(TenantScope(tenant))).conversations == ()
    # A gateway that still knows the deleted tenant's key writes nothing, and says why.
    with pytest.raises(OwnerGone):
        await conv.create_conversation(scope, {}, [msg("late")])
    with pytest.raises(OwnerGone):
        await conv.save_response(response(scope, "q", "a"))
