"""Stored responses and conversations are private (item 2), on SQLite and PostgreSQL: another
tenant, another key of the same tenant and another widget visitor get a 404 for every id they
did not create (read, continue, list, change, delete); ``store`` off and the tenant setting
forcing it off; deletion by the owner, by an operator (admin API) and of everything one end
user stored; the ledger's records carry the response id."""

from __future__ import annotations

from datetime import timedelta
from pathlib import Path
from typing import Any

import openai
import pytest
from sqlalchemy import update

from gateway.responses.retention import purge_once
from tenants.conversation_models import ConversationRow, ResponseRow
from tenants.models import utcnow
from tests.gateway.harness import LiveGateway, live_gateway, make_settings
from tests.widget.helpers import new_session, widget_tenant

SITE = "https://shop.example"


async def assert_hidden(
    client: openai.AsyncOpenAI, model: str, resp_id: str, conv_id: str, item_id: str = ""
) -> None:
    """Every route answers 404 for ids of another owner (``item_id``: one of its stored
    items, named by an ``item_reference``)."""
    ref = [{"type": "item_reference", "id": item_id}] if item_id else None
    calls: list[Any] = [
        client.responses.retrieve(resp_id),
        client.responses.input_items.list(resp_id),
        client.responses.delete(resp_id),
        client.responses.create(model=model, input="hi", previous_response_id=resp_id),
        client.responses.create(model=model, input="hi", conversation=conv_id),
        client.conversations.retrieve(conv_id),
        client.conversations.update(conv_id, metadata={"x": "y"}),
        client.conversations.items.list(conv_id),
        client.conversations.items.create(
            conv_id, items=[{"type": "message", "role": "user", "content": "intrude"}]
        ),
        client.conversations.delete(conv_id),
    ]
    if ref is not None:
        calls.append(client.responses.create(model=model, input=ref))  # type: ignore[arg-type]
    for call in calls:
        with pytest.raises(openai.NotFoundError) as caught:
            await call
        assert caught.value.status_code == 404


async def _made(client: openai.AsyncOpenAI, model: str) -> tuple[str, str]:
    conv = await client.conversations.create(
        items=[{"type": "message", "role": "user", "content": "secret context"}]
    )
    r = await client.responses.create(
        model=model, input="my secret", conversation=conv.id, max_output_tokens=16
    )
    return r.id, conv.id


async def test_other_tenant_and_other_key_get_404(
    any_database: str, demo_model_dir: Path, tmp_path: Path
) -> None:
    settings = make_settings(any_database, tmp_path)
    async with live_gateway(settings, demo_model_dir) as gw:
        model = gw.state.model_name
        a, b = await gw.create_tenant("iso-a"), await gw.create_tenant("iso-b")
        owner = gw.openai(a.key)
        resp_id, conv_id = await _made(owner, model)
        item_id = (await owner.responses.retrieve(resp_id)).output[0].id
        await assert_hidden(gw.openai(b.key), model, resp_id, conv_id, item_id)
        second = await gw.admin("POST", f"/tenants/{a.id}/keys", {"kind": "server"})
        await assert_hidden(gw.openai(second["key"]), model, resp_id, conv_id, item_id)
        # the owner still has all of it, untouched
        assert (await owner.responses.retrieve(resp_id)).id == resp_id
        items = await owner.conversations.items.list(conv_id, order="asc")
        assert items.data[0].content[0].text == "secret context"
        assert len(items.data) == 3


async def _visitor(gw: LiveGateway, server_key: str, user: str) -> openai.AsyncOpenAI:
    status, session = await new_session(gw, server_key, SITE, user=user)
    assert status == 201, session
    return gw.openai(session["token"], default_headers={"Origin": SITE})


async def test_other_visitor_of_the_same_tenant_gets_404(
    any_database: str, demo_model_dir: Path, tmp_path: Path
) -> None:
    settings = make_settings(any_database, tmp_path)
    async with live_gateway(settings, demo_model_dir) as gw:
        model = gw.state.model_name
        t = await widget_tenant(gw, "visitors", [SITE])
        alice = await _visitor(gw, t.server_key, "alice")
        bob = await _visitor(gw, t.server_key, "bob")
        resp_id, conv_id = await _made(alice, model)
        await assert_hidden(bob, model, resp_id, conv_id)
        # the server key of the tenant is another owner too
        await assert_hidden(gw.openai(t.server_key), model, resp_id, conv_id)
        # alice, on a second device (a new token for the same end user), sees her own
        again = await _visitor(gw, t.server_key, "alice")
        assert (await again.responses.retrieve(resp_id)).id == resp_id
        # the operator deletes everything alice stored; bob's stays
        bob_resp, _ = await _made(bob, model)
        out = await gw.admin("DELETE", f"/tenants/{t.id}/end-users/alice/conversations")
        assert out == {"deleted": True, "conversations": 1, "responses": 1, "items": 3}
        with pytest.raises(openai.NotFoundError):
            await alice.responses.retrieve(resp_id)
        assert (await bob.responses.retrieve(bob_resp)).id == bob_resp
        audit = await gw.admin("GET", f"/tenants/{t.id}/audit")
        rows = [r for r in audit["data"] if r["action"] == "conversation.delete_owner"]
        assert rows and rows[0]["details"]["owner"] == "user:alice"


async def test_store_off_and_the_tenant_setting(
    any_database: str, demo_model_dir: Path, tmp_path: Path
) -> None:
    settings = make_settings(any_database, tmp_path)
    async with live_gateway(settings, demo_model_dir) as gw:
        model = gw.state.model_name
        t = await gw.create_tenant("store")
        client = gw.openai(t.key)
        r = await client.responses.create(model=model, input="x", store=False, max_output_tokens=16)
        assert r.store is False
        with pytest.raises(openai.NotFoundError):
            await client.responses.retrieve(r.id)
        await gw.admin("PATCH", f"/tenants/{t.id}", {"conversation_store": False})

        async def forced_off() -> bool:
            r = await client.responses.create(model=model, input="x", max_output_tokens=16)
            return r.store is False

        await wait_for_async(forced_off)
        r = await client.responses.create(model=model, input="x", max_output_tokens=16)
        with pytest.raises(openai.NotFoundError):
            await client.responses.retrieve(r.id)
        with pytest.raises(openai.BadRequestError) as refused:
            await client.conversations.create()
        assert refused.value.code == "store_disabled"


async def wait_for_async(cond: Any, timeout: float = 60.0) -> None:
    """Until ``await cond()`` holds (a setting reaching the key cache through its event)."""
    import asyncio

    async with asyncio.timeout(timeout):
        while not await cond():
            await asyncio.sleep(0.05)


async def test_owner_and_operator_deletion_and_the_ledger_link(
    any_database: str, demo_model_dir: Path, tmp_path: Path
) -> None:
    settings = make_settings(any_database, tmp_path)
    async with live_gateway(settings, demo_model_dir) as gw:
        model = gw.state.model_name
        t = await gw.create_tenant("delete")
        client = gw.openai(t.key)
        resp_id, conv_id = await _made(client, model)
        deleted = await client.conversations.delete(conv_id)
        assert deleted.deleted and deleted.id == conv_id
        with pytest.raises(openai.NotFoundError):
            await client.responses.retrieve(resp_id)  # made in the conversation: gone with it
        resp_id, conv_id = await _made(client, model)
        out = await gw.admin("DELETE", f"/tenants/{t.id}/conversations/{conv_id}")
        assert out["conversations"] == 1 and out["responses"] == 1
        with pytest.raises(openai.NotFoundError):
            await client.conversations.retrieve(conv_id)
        # the ledger's record of a turn is keyed by its response id
        path = f"/tenants/{t.id}/usage/records"

        async def recorded() -> bool:
            records = (await gw.admin("GET", path))["data"]
            return any(r["request_id"] == resp_id for r in records)

        await wait_for_async(recorded)


async def test_retention_purge_through_the_gateway(
    any_database: str, demo_model_dir: Path, tmp_path: Path
) -> None:
    """The tenant's retention override reaches the gateway's purge: a conversation idle longer
    is gone (404), the other tenant's (the 30-day default) stays."""
    settings = make_settings(any_database, tmp_path)
    async with live_gateway(settings, demo_model_dir) as gw:
        model = gw.state.model_name
        short, default = await gw.create_tenant("short"), await gw.create_tenant("default")
        await gw.admin("PATCH", f"/tenants/{short.id}", {"conversation_retention_days": 1})
        made = {t.id: await _made(gw.openai(t.key), model) for t in (short, default)}
        store = gw.state.store
        async with store.sessions() as session, session.begin():
            old = utcnow() - timedelta(days=2)
            await session.execute(update(ConversationRow).values(updated_at=old))
            await session.execute(update(ResponseRow).values(created_at=old))
        purged = await purge_once(gw.app)
        assert (purged.conversations, purged.responses) == (1, 1)
        with pytest.raises(openai.NotFoundError):
            await gw.openai(short.key).conversations.retrieve(made[short.id][1])
        kept = await gw.openai(default.key).conversations.retrieve(made[default.id][1])
        assert kept.id == made[default.id][1]
