"""Structured outputs and tool calling through a live gateway (demo model: random weights, so
every valid answer below is the grammar's doing, not the model's), with the official ``openai``
client and its helpers: ``parse`` with a pydantic model, each ``tool_choice``, a full round trip,
streamed calls assembled by the SDK's stream helper, n choices, refusals of schemas the grammar
engine cannot enforce. Every answer is also checked against OpenAI's schemas (the harness)."""

from __future__ import annotations

import json
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any, Literal

import openai
import pytest
import pytest_asyncio
from pydantic import BaseModel, Field

from tests.gateway.harness import LiveGateway, TenantHandle, gateway_on_fresh_database

pytestmark = pytest.mark.asyncio(loop_scope="module")

SYSTEM = "You are the Acme order desk. Answer briefly; look orders up before you answer."
ASK = [{"role": "user", "content": "My order 4711 has not arrived. Where is it?"}]


class Item(BaseModel):
    sku: str = Field(max_length=6)
    quantity: int = Field(ge=1, le=9)


class OrderSummary(BaseModel):
    order_id: int = Field(ge=1, le=9999)
    status: Literal["shipped", "delayed", "lost"]
    items: list[Item] = Field(max_length=2)
    gift: bool


class GetOrderStatus(BaseModel):
    """Look an order up by its number."""

    order_id: int = Field(ge=1, le=99999)
    channel: Literal["web", "phone"]


class CancelOrder(BaseModel):
    """Cancel an order."""

    order_id: int = Field(ge=1, le=99999)


TOOLS = [
    openai.pydantic_function_tool(GetOrderStatus, name="get_order_status"),
    openai.pydantic_function_tool(CancelOrder, name="cancel_order"),
]
STATUS = {"status": "shipped", "carrier": "DHL", "eta": "tomorrow"}


@pytest_asyncio.fixture(scope="module", loop_scope="module")
async def gw(
    template_database: str, demo_model_dir: Path, tmp_path_factory: pytest.TempPathFactory
) -> AsyncIterator[LiveGateway]:
    var_dir = tmp_path_factory.mktemp("tools")
    async with gateway_on_fresh_database(template_database, demo_model_dir, var_dir) as live:
        yield live


@pytest_asyncio.fixture(scope="module", loop_scope="module")
async def tenant(gw: LiveGateway) -> TenantHandle:
    limits = {"rpm": 10_000, "tpm": 10_000_000, "max_concurrency": 16, "max_output_tokens": 400}
    return await gw.create_tenant("tools", system_prompt=SYSTEM, limits=limits)


@pytest_asyncio.fixture(scope="module", loop_scope="module")
async def client(gw: LiveGateway, tenant: TenantHandle) -> openai.AsyncOpenAI:
    return gw.openai(tenant.key)


def _args(gw: LiveGateway, **kw: Any) -> dict[str, Any]:
    base: dict[str, Any] = {"model": gw.state.model_name, "messages": ASK, "max_tokens": 300}
    return {**base, "temperature": 1.0, "seed": 7, **kw}


async def test_parse_returns_the_pydantic_object(
    gw: LiveGateway, client: openai.AsyncOpenAI
) -> None:
    for seed in range(3):
        done = await client.chat.completions.parse(
            **_args(gw, seed=seed), response_format=OrderSummary
        )
        message = done.choices[0].message
        assert isinstance(message.parsed, OrderSummary), message.content
        assert message.refusal is None and done.choices[0].finish_reason == "stop"
        assert OrderSummary.model_validate_json(message.content or "") == message.parsed


async def test_json_object_is_an_object(gw: LiveGateway, client: openai.AsyncOpenAI) -> None:
    done = await client.chat.completions.create(
        **_args(gw, max_tokens=60), response_format={"type": "json_object"}
    )
    choice = done.choices[0]
    if choice.finish_reason == "stop":  # a random model may still be writing at 60 tokens
        assert isinstance(json.loads(choice.message.content or ""), dict)
    else:
        assert (choice.message.content or "").startswith("{")


async def test_required_calls_a_declared_function(
    gw: LiveGateway, client: openai.AsyncOpenAI
) -> None:
    done = await client.chat.completions.create(**_args(gw), tools=TOOLS, tool_choice="required")
    choice = done.choices[0]
    assert choice.finish_reason == "tool_calls"
    assert choice.message.content is None and choice.message.tool_calls
    for call in choice.message.tool_calls:
        assert call.id.startswith("call_") and call.type == "function"
        model = {"get_order_status": GetOrderStatus, "cancel_order": CancelOrder}[
            call.function.name
        ]
        model.model_validate_json(call.function.arguments)


async def test_a_named_function_is_the_one_called(
    gw: LiveGateway, client: openai.AsyncOpenAI
) -> None:
    named = {"type": "function", "function": {"name": "cancel_order"}}
    for parallel in (True, False):
        done = await client.chat.completions.create(
            **_args(gw), tools=TOOLS, tool_choice=named, parallel_tool_calls=parallel
        )
        (call,) = done.choices[0].message.tool_calls or []
        assert call.function.name == "cancel_order"
        CancelOrder.model_validate_json(call.function.arguments)


async def test_auto_and_none_answer_in_text_or_valid_calls(
    gw: LiveGateway, client: openai.AsyncOpenAI
) -> None:
    for choice_ in ("auto", "none"):
        done = await client.chat.completions.create(
            **_args(gw, max_tokens=24), tools=TOOLS, tool_choice=choice_
        )
        message = done.choices[0].message
        if choice_ == "none":
            assert not message.tool_calls and isinstance(message.content, str)
        for call in message.tool_calls or []:  # a call the model starts is constrained
            assert call.function.name in ("get_order_status", "cancel_order")


async def test_a_full_round_trip(gw: LiveGateway, client: openai.AsyncOpenAI) -> None:
    first = await client.chat.completions.create(
        **_args(gw),
        tools=TOOLS,
        tool_choice={"type": "function", "function": {"name": "get_order_status"}},
    )
    call = (first.choices[0].message.tool_calls or [])[0]
    assistant = first.choices[0].message.model_dump(exclude_none=True)
    result = {"role": "tool", "tool_call_id": call.id, "content": json.dumps(STATUS)}
    second = await client.chat.completions.create(
        **_args(gw, max_tokens=12, messages=[*ASK, assistant, result]),
        tools=TOOLS,
        tool_choice="none",
    )
    answer = second.choices[0]
    assert isinstance(answer.message.content, str) and not answer.message.tool_calls
    assert answer.finish_reason in ("stop", "length")
    assert first.usage is not None and second.usage is not None
    # the tools render the same every time: the second prompt starts with the first's blocks
    assert second.usage.prompt_tokens > first.usage.prompt_tokens
    cached = second.usage.prompt_tokens_details
    assert cached is not None and cached.cached_tokens >= 16 * (first.usage.prompt_tokens // 16 - 1)


async def test_streamed_calls_are_assembled_by_the_sdk(
    gw: LiveGateway, client: openai.AsyncOpenAI
) -> None:
    kw = _args(gw, seed=11)
    fragments: list[str] = []
    async with client.chat.completions.stream(**kw, tools=TOOLS, tool_choice="required") as stream:
        async for event in stream:
            if event.type == "tool_calls.function.arguments.delta":
                fragments.append(event.arguments_delta)
        final = await stream.get_final_completion()
    choice = final.choices[0]
    assert choice.finish_reason == "tool_calls"
    calls = choice.message.tool_calls or []
    assert calls and len(fragments) >= len(calls)
    for call in calls:
        assert isinstance(call.function.parsed_arguments, GetOrderStatus | CancelOrder)
    # the same request not streamed: the same calls
    whole = await client.chat.completions.create(**kw, tools=TOOLS, tool_choice="required")
    expected = [
        (c.function.name, c.function.arguments) for c in whole.choices[0].message.tool_calls or []
    ]
    assert [(c.function.name, c.function.arguments) for c in calls] == expected
    assert "".join(fragments) == "".join(a for _, a in expected)


async def test_n_choices_each_call(gw: LiveGateway, client: openai.AsyncOpenAI) -> None:
    done = await client.chat.completions.create(
        **_args(gw), n=3, tools=TOOLS, tool_choice="required", parallel_tool_calls=False
    )
    assert [c.index for c in done.choices] == [0, 1, 2]
    for c in done.choices:
        assert c.finish_reason == "tool_calls" and len(c.message.tool_calls or []) == 1


UNIQUE = {"type": "object", "properties": {"ids": {"type": "array", "uniqueItems": True}}}


async def test_schemas_the_engine_cannot_enforce_are_400s(
    gw: LiveGateway, client: openai.AsyncOpenAI
) -> None:
    bad_tool = {"type": "function", "function": {"name": "merge", "parameters": UNIQUE}}
    cases = [
        ({"tools": [TOOLS[0], bad_tool]}, "tools[1].function.parameters"),
        (
            {
                "response_format": {
                    "type": "json_schema",
                    "json_schema": {"name": "o", "schema": UNIQUE},
                }
            },
            "response_format.json_schema.schema",
        ),
        (
            {
                "response_format": {
                    "type": "json_schema",
                    "json_schema": {"name": "o", "schema": {"type": "string", "pattern": "(?=a)b"}},
                }
            },
            "response_format.json_schema.schema",
        ),
    ]
    for kw, param in cases:
        with pytest.raises(openai.BadRequestError) as info:
            await client.chat.completions.create(**_args(gw), **kw)
        body: Any = info.value.body
        assert body["param"] == param and body["code"] == "unsupported_schema"
    assert "uniqueItems" in str(info.value) or "look-around" in str(info.value)


async def test_models_list_has_a_request_id(gw: LiveGateway, tenant: TenantHandle) -> None:
    headers = {"Authorization": f"Bearer {tenant.key}"}
    async with gw.http.get(f"{gw.base_url}/v1/models", headers=headers) as resp:
        assert resp.status == 200 and resp.headers["x-request-id"].startswith("req-")
    models = await gw.openai(tenant.key).models.list()
    assert [m.id for m in models.data] == [gw.state.model_name]


async def test_auto_answers_in_words_as_the_model_would(
    gw: LiveGateway, client: openai.AsyncOpenAI
) -> None:
    """The lazy grammar of ``auto`` lets free text through untouched: greedy tokens are those of
    the same prompt without it (``none``: the tools are rendered either way)."""
    kw = _args(gw, max_tokens=24, temperature=0.0)
    auto = await client.chat.completions.create(**kw, tools=TOOLS, tool_choice="auto")
    free = await client.chat.completions.create(**kw, tools=TOOLS, tool_choice="none")
    text = free.choices[0].message.content or ""
    assert "<tool_call>" not in text
    assert auto.choices[0].message.content == text and not auto.choices[0].message.tool_calls


async def test_streamed_calls_carry_their_logprobs(
    gw: LiveGateway, client: openai.AsyncOpenAI
) -> None:
    kw = _args(gw, seed=4, logprobs=True, top_logprobs=2, parallel_tool_calls=False)
    stream = await client.chat.completions.create(
        **kw,
        tools=TOOLS,
        tool_choice="required",
        stream=True,
        stream_options={"include_usage": True},
    )
    tokens: list[str] = []
    usage, reasons, name, arguments = None, [], "", ""
    async for chunk in stream:
        usage = chunk.usage or usage
        for c in chunk.choices:
            tokens += [e.token for e in (c.logprobs.content or [])] if c.logprobs else []
            reasons += [c.finish_reason] if c.finish_reason else []
            for d in c.delta.tool_calls or []:
                name += (d.function.name or "") if d.function else ""
                arguments += (d.function.arguments or "") if d.function else ""
    assert reasons == ["tool_calls"] and usage is not None
    # one entry per token of the answer the model wrote (the demo model's format is Hermes')
    written = f'<tool_call>\n{{"name": "{name}", "arguments": {arguments}}}\n</tool_call>'
    assert "".join(tokens) == written
    assert len(tokens) in (usage.completion_tokens, usage.completion_tokens - 1)  # EOS or not
