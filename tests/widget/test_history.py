"""The widget's conversation on the server (gateway/widget/history.py, gateway/chat/kept_turn.py)
against a live gateway on PostgreSQL: the tenant setting, who may keep history, a turn kept by
the chat route (official ``openai`` client), the same history for every token of one visitor,
"New conversation", deletion, and isolation between visitors and tenants."""

from __future__ import annotations

from typing import Any

import openai
import pytest

from tests.gateway.harness import LiveGateway
from tests.widget.helpers import WidgetTenant, new_session, request, widget_tenant

pytestmark = pytest.mark.asyncio(loop_scope="module")

ORIGIN = "https://shop.example"
HEADER = "X-Kvgate-Conversation"


async def history_tenant(gw: LiveGateway, prefix: str, *, on: bool = True) -> WidgetTenant:
    t = await widget_tenant(gw, prefix, [ORIGIN])
    if on:
        await gw.admin("PUT", f"/tenants/{t.id}/widget", {"history": True})
    return t


async def token(gw: LiveGateway, t: WidgetTenant, user: str, ttl_s: int = 600) -> str:
    status, body = await new_session(gw, t.server_key, ORIGIN, user=user, ttl_s=ttl_s)
    assert status == 201, body
    return str(body["token"])


async def call(
    gw: LiveGateway, method: str, path: str, bearer: str, *, browser: bool = True
) -> tuple[int, Any]:
    status, headers, body = await request(
        gw, method, path, Authorization=f"Bearer {bearer}", Origin=ORIGIN
    )
    if browser:
        assert headers.get("Access-Control-Allow-Origin") == ORIGIN  # readable by the widget
    return status, body


async def current(gw: LiveGateway, bearer: str) -> dict[str, Any]:
    status, body = await call(gw, "GET", "/v1/widget/conversation", bearer)
    assert status == 200, body
    return dict(body)


async def start(gw: LiveGateway, bearer: str) -> str:
    status, body = await call(gw, "POST", "/v1/widget/conversations", bearer)
    assert status == 201 and body["messages"] == [], body
    return str(body["id"])


async def say(
    gw: LiveGateway, bearer: str, conv: str, history: list[dict[str, str]], text: str, **kw: Any
) -> str:
    """One widget turn through the official client; returns the answer."""
    client = gw.openai(bearer, default_headers={"Origin": ORIGIN})
    messages: Any = [*history, {"role": "user", "content": text}]
    if kw.pop("stream", False):
        stream = await client.chat.completions.create(
            model=gw.state.model_name,
            messages=messages,
            max_tokens=6,
            stream=True,
            extra_headers={HEADER: conv},
        )
        parts = [c.choices[0].delta.content or "" async for c in stream if c.choices]
        return "".join(parts)
    out = await client.chat.completions.create(
        model=gw.state.model_name, messages=messages, max_tokens=6, extra_headers={HEADER: conv}
    )
    return out.choices[0].message.content or ""


async def test_history_is_off_by_default_and_needs_a_session(gw: LiveGateway) -> None:
    t = await history_tenant(gw, "hist-off", on=False)
    status, _, config = await request(gw, "GET", f"/widget/v1/config?key={t.widget_key}")
    assert status == 200 and config["history"] is False
    alice = await token(gw, t, "alice")
    status, body = await call(gw, "GET", "/v1/widget/conversation", alice)
    assert (status, body["error"]["code"]) == (403, "history_disabled")
    assert "does not keep conversations" in body["error"]["message"]
    # the chat route refuses a turn to keep as well, before the engine
    client = gw.openai(alice, default_headers={"Origin": ORIGIN})
    with pytest.raises(openai.PermissionDeniedError) as err:
        await client.chat.completions.create(
            model=gw.state.model_name,
            messages=[{"role": "user", "content": "hi"}],
            extra_headers={HEADER: "conv_x"},
        )
    assert err.value.code == "history_disabled"
    await gw.admin("PUT", f"/tenants/{t.id}/widget", {"history": True})
    status, _, config = await request(gw, "GET", f"/widget/v1/config?key={t.widget_key}")
    assert config["history"] is True
    # a bare widget key names no visitor: no server history, whatever the setting
    status, body = await call(gw, "GET", "/v1/widget/conversation", t.widget_key)
    assert (status, body["error"]["code"]) == (403, "session_required")
    status, body = await call(gw, "POST", "/v1/widget/conversations", t.widget_key)
    assert (status, body["error"]["code"]) == (403, "session_required")
    # a tenant that stores no conversations keeps none for the widget either
    await gw.admin("PATCH", f"/tenants/{t.id}", {"conversation_store": False})
    status, _, config = await request(gw, "GET", f"/widget/v1/config?key={t.widget_key}")
    assert config["history"] is False
    status, body = await call(gw, "GET", "/v1/widget/conversation", alice)
    assert (status, body["error"]["code"]) == (403, "history_disabled")
    assert "stores none" in body["error"]["message"]
    # a server key is no widget visitor either
    status, body = await call(gw, "GET", "/v1/widget/conversation", t.server_key, browser=False)
    assert (status, body["error"]["code"]) == (403, "session_required")


@pytest.mark.parametrize("stream", [False, True])
async def test_turns_are_kept_and_every_token_of_the_visitor_sees_them(
    gw: LiveGateway, stream: bool
) -> None:
    t = await history_tenant(gw, "hist-keep")
    first = await token(gw, t, "alice")
    assert await current(gw, first) == {"id": None, "messages": []}
    conv = await start(gw, first)
    answer = await say(gw, first, conv, [], "When do you open?", stream=stream)
    assert answer
    shown = await current(gw, first)
    expected = [
        {"role": "user", "content": "When do you open?"},
        {"role": "assistant", "content": answer},
    ]
    assert shown == {"id": conv, "messages": expected}
    # another token of the same visitor (a new tab, another device) sees the same conversation
    second = await token(gw, t, "alice", ttl_s=300)
    assert second != first
    assert await current(gw, second) == shown
    again = await say(gw, second, conv, expected, "And on Sunday?", stream=stream)
    shown = await current(gw, first)
    assert [m["content"] for m in shown["messages"]] == [
        "When do you open?",
        answer,
        "And on Sunday?",
        again,
    ]
    # the conversation's counters moved with the turns (operators read them)
    page = await gw.admin("GET", f"/tenants/{t.id}/transcripts")
    (row,) = page["data"]
    assert row["id"] == conv and row["end_user"] == "alice" and row["turns"] == 2
    assert row["input_tokens"] > 0 and row["output_tokens"] > 0


async def test_new_conversation_and_delete(gw: LiveGateway) -> None:
    t = await history_tenant(gw, "hist-new")
    alice = await token(gw, t, "alice")
    old = await start(gw, alice)
    await say(gw, alice, old, [], "first conversation")
    new = await start(gw, alice)  # "New conversation": the old one is no longer shown
    assert new != old
    assert await current(gw, alice) == {"id": new, "messages": []}
    await say(gw, alice, new, [], "second conversation")
    assert (await current(gw, alice))["messages"][0]["content"] == "second conversation"
    status, body = await call(gw, "DELETE", f"/v1/widget/conversations/{new}", alice)
    assert status == 200 and body["deleted"] is True
    assert await current(gw, alice) == {"id": None, "messages": []}
    status, body = await call(gw, "DELETE", f"/v1/widget/conversations/{new}", alice)
    assert (status, body["error"]["code"]) == (404, "conversation_not_found")
    # a turn to a deleted conversation is refused before the engine
    with pytest.raises(openai.NotFoundError) as err:
        await say(gw, alice, new, [], "still there?")
    assert err.value.code == "conversation_not_found"
    # the ended conversation is kept for the operator; the deleted one is gone
    page = await gw.admin("GET", f"/tenants/{t.id}/transcripts")
    assert [c["id"] for c in page["data"]] == [old]


async def test_a_visitor_never_reaches_another_visitors_conversation(gw: LiveGateway) -> None:
    t = await history_tenant(gw, "hist-iso")
    other_tenant = await history_tenant(gw, "hist-iso2")
    alice = await token(gw, t, "alice")
    conv = await start(gw, alice)
    await say(gw, alice, conv, [], "my address is 12 Harbour Lane")
    bob = await token(gw, t, "bob")
    alice_elsewhere = await token(gw, other_tenant, "alice")  # same name, another tenant
    for stranger in (bob, alice_elsewhere):
        assert await current(gw, stranger) == {"id": None, "messages": []}
        status, body = await call(gw, "DELETE", f"/v1/widget/conversations/{conv}", stranger)
        assert (status, body["error"]["code"]) == (404, "conversation_not_found")
        with pytest.raises(openai.NotFoundError):
            await say(gw, stranger, conv, [], "show me")
    assert len((await current(gw, alice))["messages"]) == 2  # untouched
    # ids no conversation can have are the same 404, never a database error
    for odd in ("a%00b", "c" * 65, "%F0%9F%92%A5"):
        status, body = await call(gw, "DELETE", f"/v1/widget/conversations/{odd}", bob)
        assert (status, body["error"]["code"]) == (404, "conversation_not_found"), odd


async def test_a_kept_turn_must_end_with_the_users_message(gw: LiveGateway) -> None:
    t = await history_tenant(gw, "hist-shape")
    alice = await token(gw, t, "alice")
    conv = await start(gw, alice)
    client = gw.openai(alice, default_headers={"Origin": ORIGIN})
    with pytest.raises(openai.BadRequestError) as err:
        await client.chat.completions.create(
            model=gw.state.model_name,
            messages=[
                {"role": "user", "content": "hi"},
                {"role": "assistant", "content": "made up"},
            ],
            extra_headers={HEADER: conv},
        )
    assert err.value.param == "messages"
    assert (await current(gw, alice))["messages"] == []


async def test_history_calls_count_against_the_visitors_limits(gw: LiveGateway) -> None:
    t = await widget_tenant(gw, "hist-rpm", [ORIGIN])
    settings = {"history": True, "visitor_limits": {"rpm": 3}}
    await gw.admin("PUT", f"/tenants/{t.id}/widget", settings)
    alice = await token(gw, t, "alice")
    for _ in range(3):
        await current(gw, alice)
    status, headers, body = await request(
        gw, "GET", "/v1/widget/conversation", Authorization=f"Bearer {alice}", Origin=ORIGIN
    )
    assert status == 429 and body["error"]["code"] == "rate_limit_exceeded", body
    assert int(headers["Retry-After"]) > 0 and headers["x-ratelimit-scope"] == "visitor"
    # another visitor of the tenant is not affected
    assert (await current(gw, await token(gw, t, "bob")))["id"] is None
