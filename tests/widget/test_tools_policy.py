"""Widget keys are public: a page's visitors may not declare tools, send tool turns or ask for a
schema (400 ``not_allowed_for_widget``, charged as every refusal); the tenant's server key may."""

from __future__ import annotations

from typing import Any

import pytest

from tests.gateway.harness import LiveGateway
from tests.widget.helpers import chat_body, request, widget_chat, widget_tenant

pytestmark = pytest.mark.asyncio(loop_scope="module")

SITE = "https://shop.example"
TOOL = {"type": "function", "function": {"name": "get_order", "parameters": {"type": "object"}}}
CALL = {"id": "call_1", "type": "function", "function": {"name": "get_order", "arguments": "{}"}}
HISTORY = [
    {"role": "user", "content": "where is my order"},
    {"role": "assistant", "content": None, "tool_calls": [CALL]},
    {"role": "tool", "tool_call_id": "call_1", "content": "shipped"},
]


@pytest.mark.parametrize(
    ("extra", "param"),
    [
        ({"tools": [TOOL]}, "tools"),
        ({"tools": [TOOL], "tool_choice": "none"}, "tools"),
        ({"response_format": {"type": "json_object"}}, "response_format"),
        ({"messages": HISTORY}, "messages[1]"),
    ],
)
async def test_widget_traffic_may_not_use_tools(
    gw: LiveGateway, extra: dict[str, Any], param: str
) -> None:
    t = await widget_tenant(gw, "wtools", [SITE])
    body = chat_body(gw, ("user", "hi"), **extra)
    status, _, answer = await widget_chat(gw, t.widget_key, SITE, body)
    assert status == 400, answer
    assert (answer["error"]["param"], answer["error"]["code"]) == (param, "not_allowed_for_widget")
    # the same request with the tenant's server key is served
    status, _, answer = await request(
        gw, "POST", "/v1/chat/completions", json=body, Authorization=f"Bearer {t.server_key}"
    )
    assert status == 200, answer


async def test_plain_widget_chat_is_unchanged(gw: LiveGateway) -> None:
    t = await widget_tenant(gw, "wplain", [SITE])
    status, _, answer = await widget_chat(gw, t.widget_key, SITE, chat_body(gw, ("user", "hi")))
    assert status == 200 and answer["choices"][0]["message"]["refusal"] is None
