"""Operators' transcripts through the admin API of a live gateway (PostgreSQL): the list (end
user, started, turns, tokens, spend) and one transcript; viewers read, editors delete, other
tenants' admins get 404; every list and read is an audit row; the tenant setting refuses both.
Conversations are made the way the widget makes them (session tokens, the chat route)."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pytest
import pytest_asyncio

from tests.gateway.harness import LiveGateway, gateway_on_fresh_database
from tests.widget.helpers import new_session, request, widget_tenant

pytestmark = pytest.mark.asyncio(loop_scope="module")

ORIGIN = "https://shop.example"


@pytest_asyncio.fixture(scope="module", loop_scope="module")
async def gw(
    template_database: str, demo_model_dir: Path, tmp_path_factory: pytest.TempPathFactory
) -> AsyncIterator[LiveGateway]:
    var = tmp_path_factory.mktemp("transcripts")
    async with gateway_on_fresh_database(template_database, demo_model_dir, var) as live:
        # $1000 per million tokens, cached or not: a conversation's spend is its tokens / 1000
        await live.admin("PUT", f"/prices/{live.state.model_name}", {"input": 1000, "output": 1000})
        yield live


async def as_admin(
    gw: LiveGateway, token: str, method: str, path: str, body: Any = None
) -> tuple[int, Any]:
    headers = {"Authorization": f"Bearer {token}"}
    url = f"{gw.base_url}/admin/v1{path}"
    async with gw.http.request(method, url, json=body, headers=headers) as resp:
        return resp.status, await resp.json()


async def principal(gw: LiveGateway, scope: str, access: str) -> str:
    made = await gw.admin("POST", "/admins", {"scope": scope, "access": access})
    return str(made["token"])


async def principal_id(gw: LiveGateway, token: str) -> str:
    status, me = await as_admin(gw, token, "GET", "/session")
    assert status == 200, me
    return str(me["principal"]["id"])


async def visitor_conversation(gw: LiveGateway, server_key: str, user: str, text: str) -> str:
    """A conversation the widget keeps for ``user``: started, then one turn."""
    _, session = await new_session(gw, server_key, ORIGIN, user=user)
    bearer = {"Authorization": f"Bearer {session['token']}", "Origin": ORIGIN}
    status, _, conv = await request(gw, "POST", "/v1/widget/conversations", **bearer)
    assert status == 201, conv
    client = gw.openai(session["token"], default_headers={"Origin": ORIGIN})
    await client.chat.completions.create(
        model=gw.state.model_name,
        messages=[{"role": "user", "content": text}],
        max_tokens=4,
        extra_headers={"X-Kvgate-Conversation": conv["id"]},
    )
    return str(conv["id"])


async def audit_actions(gw: LiveGateway, tenant_id: str) -> list[dict[str, Any]]:
    page = await gw.admin("GET", f"/tenants/{tenant_id}/audit?limit=200")
    return [a for a in page["data"] if a["action"].startswith("transcripts.")]


async def test_list_read_and_the_audit_log(gw: LiveGateway) -> None:
    t = await widget_tenant(gw, "tr-read", [ORIGIN])
    await gw.admin("PUT", f"/tenants/{t.id}/widget", {"history": True})
    alice = await visitor_conversation(gw, t.server_key, "alice", "Where is order 4411?")
    bob = await visitor_conversation(gw, t.server_key, "bob", "Do you ship to Oslo?")
    viewer = await principal(gw, t.id, "viewer")
    status, page = await as_admin(gw, viewer, "GET", f"/tenants/{t.id}/transcripts")
    assert status == 200, page
    assert [(c["id"], c["end_user"]) for c in page["data"]] == [(bob, "bob"), (alice, "alice")]
    for row in page["data"]:
        assert row["owner_kind"] == "user" and row["turns"] == 1
        assert row["total_tokens"] == row["input_tokens"] + row["output_tokens"] > 0
        assert row["started_at"] and row["spend_usd"] >= 0
    status, one = await as_admin(gw, viewer, "GET", f"/tenants/{t.id}/transcripts/{alice}")
    assert status == 200, one
    assert one["conversation"]["id"] == alice
    roles = [(e["role"], e["type"]) for e in one["entries"]]
    assert roles == [("user", "message"), ("assistant", "message")]
    assert one["entries"][0]["text"] == "Where is order 4411?"
    # one page at a time, newest first
    status, first = await as_admin(gw, viewer, "GET", f"/tenants/{t.id}/transcripts?limit=1")
    assert [c["id"] for c in first["data"]] == [bob] and first["next_cursor"]
    cursor = first["next_cursor"]
    path = f"/tenants/{t.id}/transcripts?limit=1&cursor={cursor}"
    status, second = await as_admin(gw, viewer, "GET", path)
    assert [c["id"] for c in second["data"]] == [alice] and second["next_cursor"] is None
    status, bad = await as_admin(gw, viewer, "GET", f"/tenants/{t.id}/transcripts?cursor=nope")
    assert (status, bad["error"]["code"]) == (422, "invalid_field")
    # every list and read is in the audit log, with who read whose conversation
    rows = await audit_actions(gw, t.id)
    reads = [a for a in rows if a["action"] == "transcripts.read"]
    assert len(reads) == 1 and reads[0]["details"] == {
        "conversation_id": alice,
        "owner": "user:alice",
    }
    lists = [a for a in rows if a["action"] == "transcripts.list"]
    assert len(lists) == 3  # the refused cursor wrote nothing
    viewer_id = await principal_id(gw, viewer)
    assert {a["actor"] for a in reads + lists} == {viewer_id}


async def test_spend_is_the_ledgers(gw: LiveGateway) -> None:
    t = await widget_tenant(gw, "tr-spend", [ORIGIN])
    await gw.admin("PUT", f"/tenants/{t.id}/widget", {"history": True})
    await visitor_conversation(gw, t.server_key, "frank", "How much is shipping?")
    async with asyncio.timeout(30):  # the ledger writes its records in batches
        while True:
            (row,) = (await gw.admin("GET", f"/tenants/{t.id}/transcripts"))["data"]
            if row["spend_usd"] > 0:
                break
            await asyncio.sleep(0.1)
    assert row["spend_usd"] == pytest.approx(row["total_tokens"] / 1000)


async def test_viewers_read_editors_delete_other_tenants_see_nothing(gw: LiveGateway) -> None:
    t = await widget_tenant(gw, "tr-roles", [ORIGIN])
    other = await widget_tenant(gw, "tr-other", [ORIGIN])
    await gw.admin("PUT", f"/tenants/{t.id}/widget", {"history": True})
    conv = await visitor_conversation(gw, t.server_key, "carol", "Cancel my order please")
    viewer = await principal(gw, t.id, "viewer")
    editor = await principal(gw, t.id, "editor")
    stranger = await principal(gw, other.id, "editor")
    path = f"/tenants/{t.id}/transcripts/{conv}"
    status, body = await as_admin(gw, viewer, "DELETE", path)
    assert (status, body["error"]["code"]) == (403, "read_only")
    for method in ("GET", "DELETE"):
        status, body = await as_admin(gw, stranger, method, path)
        assert (status, body["error"]["code"]) == (404, "tenant_not_found")
    # another tenant's id under this tenant's route: not found, nothing said about it
    status, body = await as_admin(gw, stranger, "GET", f"/tenants/{other.id}/transcripts/{conv}")
    assert (status, body["error"]["code"]) == (404, "conversation_not_found")
    status, body = await as_admin(gw, editor, "DELETE", path)
    assert status == 200 and body["deleted"] is True
    status, body = await as_admin(gw, viewer, "GET", path)
    assert (status, body["error"]["code"]) == (404, "conversation_not_found")
    deletes = [a for a in await audit_actions(gw, t.id) if a["action"] == "transcripts.delete"]
    assert [a["details"]["conversation_id"] for a in deletes] == [conv]


async def test_the_tenant_setting_turns_reading_off(gw: LiveGateway) -> None:
    t = await widget_tenant(gw, "tr-off", [ORIGIN])
    await gw.admin("PUT", f"/tenants/{t.id}/widget", {"history": True})
    conv = await visitor_conversation(gw, t.server_key, "dave", "My password is hunter2")
    viewer = await principal(gw, t.id, "viewer")
    editor = await principal(gw, t.id, "editor")
    assert await gw.admin("GET", f"/tenants/{t.id}/transcript-access") == {"enabled": True}
    status, body = await as_admin(
        gw, viewer, "PUT", f"/tenants/{t.id}/transcript-access", {"enabled": False}
    )
    assert (status, body["error"]["code"]) == (403, "read_only")
    status, body = await as_admin(
        gw, editor, "PUT", f"/tenants/{t.id}/transcript-access", {"enabled": False}
    )
    assert status == 200 and body == {"enabled": False}
    before = len(await audit_actions(gw, t.id))
    for path in (f"/tenants/{t.id}/transcripts", f"/tenants/{t.id}/transcripts/{conv}"):
        for token in (viewer, editor):
            status, body = await as_admin(gw, token, "GET", path)
            assert (status, body["error"]["code"]) == (403, "transcripts_disabled"), body
            assert "transcript access is turned off" in body["error"]["message"]
    after = await audit_actions(gw, t.id)
    assert len(after) == before  # a refused read shows nothing and writes no read row
    assert after[0]["action"] == "transcripts.set_access"
    assert after[0]["details"] == {"before": True, "after": False}
    # the conversation itself is untouched: the visitor still has it
    status, body = await as_admin(
        gw, editor, "PUT", f"/tenants/{t.id}/transcript-access", {"enabled": True}
    )
    status, one = await as_admin(gw, viewer, "GET", f"/tenants/{t.id}/transcripts/{conv}")
    assert status == 200 and one["entries"][0]["text"] == "My password is hunter2"
    # bad bodies are a 400/422, never a 500
    for bad in ({"enabled": "yes"}, {}, {"enabled": True, "x": 1}):
        status, body = await as_admin(gw, editor, "PUT", f"/tenants/{t.id}/transcript-access", bad)
        assert 400 <= status < 500 and body["error"]["message"], (bad, status, body)
