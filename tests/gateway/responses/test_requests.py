"""What a ``POST /v1/responses`` may carry (item 1): fields kvgate does not do are a 400 naming
them; the tenant's client-system policy applies to ``instructions`` and system input as to a
chat system message; function tools round-trip through ``function_call`` /
``function_call_output`` items; widget keys keep chat's rules."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import openai
import pytest

from tests.gateway.harness import LiveGateway, live_gateway, make_settings
from tests.widget.helpers import request, widget_tenant

SITE = "https://shop.example"
WEATHER = {
    "type": "function",
    "name": "get_weather",
    "description": "the weather in a city",
    "strict": True,
    "parameters": {
        "type": "object",
        "properties": {"city": {"enum": ["Oslo", "Bergen"]}},
        "required": ["city"],
        "additionalProperties": False,
    },
}


async def _refused(gw: LiveGateway, key: str, body: dict[str, Any], **headers: str) -> Any:
    doc = {"model": gw.state.model_name, "input": "hi", "max_output_tokens": 16, **body}
    status, _, answer = await request(
        gw, "POST", "/v1/responses", json=doc, Authorization=f"Bearer {key}", **headers
    )
    assert status == 400, answer
    return answer["error"]


UNSUPPORTED = [
    ({"tools": [{"type": "web_search"}]}, "tools[0].type"),
    ({"tools": [WEATHER, {"type": "file_search", "vector_store_ids": ["v"]}]}, "tools[1].type"),
    ({"background": True}, "background"),
    ({"reasoning": {"effort": "high"}}, "reasoning"),
    ({"include": ["message.output_text.logprobs"]}, "include"),
    ({"prompt": {"id": "pmpt_1"}}, "prompt"),
    ({"truncation": "auto"}, "truncation"),
    (
        {"input": [{"role": "user", "content": [{"type": "input_image", "image_url": "x"}]}]},
        "input[0].content[0].type",
    ),
    ({"input": [{"type": "reasoning", "summary": []}]}, "input[0].type"),
    ({"previous_response_id": "resp_1", "conversation": "conv_1"}, "previous_response_id"),
    ({"surprise": 1}, "surprise"),
    ({"max_output_tokens": 8}, "max_output_tokens"),  # OpenAI's minimum is 16
]


async def test_unsupported_fields_are_named(
    gateway_database: str, demo_model_dir: Path, tmp_path: Path
) -> None:
    settings = make_settings(gateway_database, tmp_path)
    async with live_gateway(settings, demo_model_dir) as gw:
        t = await gw.create_tenant("unsupported")
        for body, param in UNSUPPORTED:
            error = await _refused(gw, t.key, body)
            assert error["param"] == param, (body, error)
            assert param.split(".")[0].split("[")[0] in error["message"], error


async def test_instructions_follow_the_client_system_policy(
    gateway_database: str, demo_model_dir: Path, tmp_path: Path
) -> None:
    settings = make_settings(gateway_database, tmp_path)
    async with live_gateway(settings, demo_model_dir) as gw:
        closed = await gw.create_tenant("closed", allow_client_system=False)
        error = await _refused(gw, closed.key, {"instructions": "Talk like a pirate."})
        assert error["param"] == "instructions"
        assert error["code"] == "system_message_not_allowed"
        dev = [{"role": "developer", "content": "x"}, {"role": "user", "content": "hi"}]
        error = await _refused(gw, closed.key, {"input": dev})
        assert error["param"] == "input[0].role"
        status, _, answer = await request(
            gw,
            "POST",
            "/v1/conversations",
            json={"items": dev},
            Authorization=f"Bearer {closed.key}",
        )
        assert status == 400 and answer["error"]["param"] == "items[0].role"
        open_ = await gw.create_tenant("open")
        r = await gw.openai(open_.key).responses.create(
            model=gw.state.model_name,
            instructions="Talk like a pirate.",
            input="hi",
            max_output_tokens=16,
        )
        assert r.instructions == "Talk like a pirate."
        items = await gw.openai(open_.key).responses.input_items.list(r.id)
        assert [i.role for i in items.data] == ["user"]  # instructions are not input items


async def test_widget_keys_keep_the_widget_rules(
    gateway_database: str, demo_model_dir: Path, tmp_path: Path
) -> None:
    settings = make_settings(gateway_database, tmp_path)
    async with live_gateway(settings, demo_model_dir) as gw:
        t = await widget_tenant(gw, "widget-rules", [SITE])
        error = await _refused(gw, t.widget_key, {"tools": [WEATHER]}, Origin=SITE)
        assert error["code"] == "not_allowed_for_widget"
        error = await _refused(gw, t.widget_key, {"instructions": "x"}, Origin=SITE)
        assert error["param"] == "instructions"  # widget traffic needs the widget opt-in too


async def test_function_tools_round_trip(
    gateway_database: str, demo_model_dir: Path, tmp_path: Path
) -> None:
    settings = make_settings(gateway_database, tmp_path)
    async with live_gateway(settings, demo_model_dir) as gw:
        t = await gw.create_tenant("tools")
        client, model = gw.openai(t.key), gw.state.model_name
        first = await client.responses.create(
            model=model,
            input="What is the weather in Oslo?",
            tools=[WEATHER],
            tool_choice="required",
            max_output_tokens=60,
        )
        calls = [o for o in first.output if o.type == "function_call"]
        assert calls and calls[0].name == "get_weather"
        assert json.loads(calls[0].arguments)["city"] in ("Oslo", "Bergen")
        result = {"type": "function_call_output", "call_id": calls[0].call_id, "output": "4 C"}
        second = await client.responses.create(
            model=model,
            previous_response_id=first.id,
            input=[result],
            tools=[WEATHER],
            tool_choice="none",
            max_output_tokens=16,
        )
        assert second.output[0].type == "message"
        # the output of the call is an input item of the second turn
        items = await client.responses.input_items.list(second.id)
        assert [i.type for i in items.data] == ["function_call_output"]
        # an output for a call nobody made is refused as chat refuses an unanswered tool turn
        with pytest.raises(openai.BadRequestError):
            await client.responses.create(
                model=model,
                input=[{"type": "function_call_output", "call_id": "nope", "output": "x"}],
                max_output_tokens=16,
            )


async def test_an_item_reference_brings_in_the_stored_item(
    gateway_database: str, demo_model_dir: Path, tmp_path: Path
) -> None:
    """``item_reference`` names one of the caller's stored items (any response or conversation):
    the turn reads it as if it were sent, and it is the turn's input item; an unknown id is a
    404 naming the item, in responses and in conversation items alike."""
    settings = make_settings(gateway_database, tmp_path)
    async with live_gateway(settings, demo_model_dir) as gw:
        t = await gw.create_tenant("refs")
        client, model = gw.openai(t.key), gw.state.model_name
        first = await client.responses.create(
            model=model, input="Remember the word kumquat.", max_output_tokens=16
        )
        asked = (await client.responses.input_items.list(first.id)).data[0]
        alone = await client.responses.create(model=model, input="And?", max_output_tokens=16)
        ref = [{"type": "item_reference", "id": asked.id}, {"role": "user", "content": "And?"}]
        both = await client.responses.create(model=model, input=ref, max_output_tokens=16)
        assert both.usage.input_tokens > alone.usage.input_tokens  # the item was read
        items = (await client.responses.input_items.list(both.id, order="asc")).data
        assert [i.id for i in items] == [asked.id, items[1].id] and len(items) == 2
        assert items[0].content[0].text == "Remember the word kumquat."
        conv = await client.conversations.create()
        added = await client.conversations.items.create(
            conv.id, items=[{"type": "item_reference", "id": first.output[0].id}]
        )
        assert added.data[0].id == first.output[0].id and added.data[0].type == "message"
        for call in (
            client.responses.create(
                model=model, input=[{"type": "item_reference", "id": "msg_nope"}]
            ),
            client.conversations.items.create(
                conv.id, items=[{"type": "item_reference", "id": "msg_nope"}]
            ),
        ):
            with pytest.raises(openai.NotFoundError) as caught:
                await call
            assert caught.value.body["param"] in ("input[0].id", "items[0].id")
