"""``POST /v1/responses`` through the official SDK (``responses.create``, ``.stream``,
``.parse``) against a live gateway; every answer and stream event is validated against OpenAI's
published schemas (tests/conformance/contract.py)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Literal

import openai
import pytest
from pydantic import BaseModel, Field

from tests.gateway.harness import live_gateway, make_settings
from tests.gateway.responses.test_requests import WEATHER

SYSTEM = "You are the support assistant of Example Incorporated. Answer briefly. " * 4


async def test_create_get_delete_and_input_items(
    gateway_database: str, demo_model_dir: Path, tmp_path: Path
) -> None:
    settings = make_settings(gateway_database, tmp_path)
    async with live_gateway(settings, demo_model_dir) as gw:
        t = await gw.create_tenant("resp", system_prompt=SYSTEM)
        client = gw.openai(t.key)
        model = gw.state.model_name
        r = await client.responses.create(model=model, input="Hello there", max_output_tokens=16)
        assert r.id.startswith("resp_") and r.object == "response"
        assert r.status in ("completed", "incomplete")
        assert r.output[0].type == "message" and r.output_text == r.output[0].content[0].text
        assert r.usage.input_tokens > 0 and 0 < r.usage.output_tokens <= 16
        assert r.usage.input_tokens_details.cached_tokens >= 0
        got = await client.responses.retrieve(r.id)
        assert got.output_text == r.output_text and got.usage == r.usage
        items = await client.responses.input_items.list(r.id)
        assert [i.type for i in items.data] == ["message"]
        assert items.data[0].content[0].text == "Hello there"
        await client.responses.delete(r.id)
        with pytest.raises(openai.NotFoundError):
            await client.responses.retrieve(r.id)


async def test_stream_events(gateway_database: str, demo_model_dir: Path, tmp_path: Path) -> None:
    settings = make_settings(gateway_database, tmp_path)
    async with live_gateway(settings, demo_model_dir) as gw:
        t = await gw.create_tenant("stream")
        client = gw.openai(t.key)
        model = gw.state.model_name
        kinds, deltas = [], []
        async with client.responses.stream(
            model=model, input="Count to three", max_output_tokens=16
        ) as stream:
            async for event in stream:
                kinds.append(event.type)
                if event.type == "response.output_text.delta":
                    deltas.append(event.delta)
                if event.type in ("response.completed", "response.incomplete"):
                    final = event.response
        assert kinds[:2] == ["response.created", "response.in_progress"]
        assert "response.output_text.delta" in kinds
        # A turn cut by max_output_tokens ends "incomplete", as OpenAI's does.
        assert kinds[-1] == f"response.{final.status}"
        assert final.output_text == "".join(deltas)
        assert final.usage.output_tokens <= 16
        stored = await client.responses.retrieve(final.id)
        assert stored.output_text == final.output_text


class Weather(BaseModel):
    """Bounded, so a random model's constrained answer always closes within the budget."""

    city: Literal["Oslo", "Bergen"]
    degrees: int = Field(ge=0, le=9)


async def test_parse_structured_output(
    gateway_database: str, demo_model_dir: Path, tmp_path: Path
) -> None:
    settings = make_settings(gateway_database, tmp_path)
    async with live_gateway(settings, demo_model_dir) as gw:
        t = await gw.create_tenant("parse")
        client = gw.openai(t.key)
        r = await client.responses.parse(
            model=gw.state.model_name,
            input="Weather in Oslo?",
            text_format=Weather,
            max_output_tokens=60,
        )
        assert r.status == "completed", r.output_text
        assert isinstance(r.output_parsed, Weather)


async def test_streamed_calls_arrive_as_they_are_written(
    gateway_database: str, demo_model_dir: Path, tmp_path: Path
) -> None:
    """A turn that may call tools streams as it is generated: each call an item of its own,
    added once its name is known, its arguments in fragments; the streamed items are the stored
    response's, ids and order included."""
    settings = make_settings(gateway_database, tmp_path)
    async with live_gateway(settings, demo_model_dir) as gw:
        t = await gw.create_tenant("stream-calls")
        client = gw.openai(t.key)
        kinds, fragments, added = [], [], []
        async with client.responses.stream(
            model=gw.state.model_name,
            input="What is the weather in Oslo?",
            tools=[WEATHER],
            tool_choice="required",
            parallel_tool_calls=False,
            max_output_tokens=200,
        ) as stream:
            async for event in stream:
                kinds.append(event.type)
                if event.type == "response.function_call_arguments.delta":
                    fragments.append(event.delta)
                if event.type == "response.output_item.added":
                    added.append(event.item.id)
            final = await stream.get_final_response()
        assert final.status == "completed", kinds
        calls = [o for o in final.output if o.type == "function_call"]
        assert calls and all(c.name == "get_weather" for c in calls)
        assert [o.id for o in final.output] == added
        assert len(fragments) > len(calls)  # written piece by piece, not sent whole
        assert "".join(fragments) == "".join(c.arguments for c in calls)
        assert kinds.index("response.output_item.added") < kinds.index(
            "response.function_call_arguments.delta"
        )
        for call in calls:
            assert json.loads(call.arguments)["city"] in ("Oslo", "Bergen")
        stored = await client.responses.retrieve(final.id)
        sdk_only = {"parsed_arguments"}  # the stream helper's own field
        assert [o.model_dump(exclude=sdk_only) for o in stored.output] == [
            o.model_dump(exclude=sdk_only) for o in final.output
        ]
