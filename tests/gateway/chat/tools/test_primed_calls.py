"""Forced tool calls on an engine that enforces JSON schemas but not the Lark dialect (vLLM),
end to end: a live gateway whose in-process engine reports vLLM's grammar kinds, so each forced
call is served primed (the call block's opening ends the prompt, a JSON schema holds the model
to the call). The demo model has random weights: every valid call below is the schema's doing.
The same requests through real vLLM servers: tests/vllm/test_vllm_backend.py."""

from __future__ import annotations

import json
from collections.abc import AsyncIterator, Iterator
from pathlib import Path

import openai
import pytest
import pytest_asyncio

from engine.remote.vllm_wire import VLLM_GRAMMARS
from tests.gateway.chat.tools.test_tools_api import (
    ASK,
    STATUS,
    TOOLS,
    CancelOrder,
    GetOrderStatus,
    _args,
)
from tests.gateway.harness import (
    LiveGateway,
    TenantHandle,
    enforce_as_vllm,
    gateway_on_fresh_database,
)

pytestmark = pytest.mark.asyncio(loop_scope="module")

SYSTEM = "You are the Acme order desk. Look orders up before you answer."
PRIMER = "<tool_call>\n"  # the demo model's plain ChatML template gets the hermes format
MODELS = {"get_order_status": GetOrderStatus, "cancel_order": CancelOrder}


@pytest.fixture(scope="module")
def json_schema_engine() -> Iterator[None]:
    with pytest.MonkeyPatch.context() as mp:
        enforce_as_vllm(mp)
        yield


@pytest_asyncio.fixture(scope="module", loop_scope="module")
async def gw(
    template_database: str,
    demo_model_dir: Path,
    tmp_path_factory: pytest.TempPathFactory,
    json_schema_engine: None,
) -> AsyncIterator[LiveGateway]:
    var_dir = tmp_path_factory.mktemp("primed")
    async with gateway_on_fresh_database(template_database, demo_model_dir, var_dir) as live:
        assert live.state.engine.info.grammars == VLLM_GRAMMARS
        yield live


@pytest_asyncio.fixture(scope="module", loop_scope="module")
async def client(gw: LiveGateway) -> openai.AsyncOpenAI:
    limits = {"rpm": 10_000, "tpm": 10_000_000, "max_concurrency": 16, "max_output_tokens": 400}
    tenant: TenantHandle = await gw.create_tenant("primed", system_prompt=SYSTEM, limits=limits)
    return gw.openai(tenant.key)


async def test_required_is_one_valid_call_with_the_opening_in_the_prompt(
    gw: LiveGateway, client: openai.AsyncOpenAI
) -> None:
    free = await client.chat.completions.create(**_args(gw, max_tokens=4), tools=TOOLS)
    for seed in range(4):
        done = await client.chat.completions.create(
            **_args(gw, seed=seed), tools=TOOLS, tool_choice="required"
        )
        choice = done.choices[0]
        assert choice.finish_reason == "tool_calls" and choice.message.content is None
        (call,) = choice.message.tool_calls or []
        assert call.id.startswith("call_") and call.type == "function"
        MODELS[call.function.name].model_validate_json(call.function.arguments)
        # the prompt is the unforced one and the opening: the answer is only the call's JSON
        primer = len(gw.state.tokenizer.encode(PRIMER))
        assert done.usage is not None and free.usage is not None
        assert done.usage.prompt_tokens == free.usage.prompt_tokens + primer


async def test_a_named_function_is_the_one_called(
    gw: LiveGateway, client: openai.AsyncOpenAI
) -> None:
    named = {"type": "function", "function": {"name": "cancel_order"}}
    done = await client.chat.completions.create(**_args(gw), tools=TOOLS, tool_choice=named)
    (call,) = done.choices[0].message.tool_calls or []
    assert call.function.name == "cancel_order"
    CancelOrder.model_validate_json(call.function.arguments)


async def test_streamed_and_whole_calls_agree(gw: LiveGateway, client: openai.AsyncOpenAI) -> None:
    kw = _args(gw, seed=11)
    async with client.chat.completions.stream(**kw, tools=TOOLS, tool_choice="required") as stream:
        final = await stream.get_final_completion()
    (call,) = final.choices[0].message.tool_calls or []
    assert final.choices[0].finish_reason == "tool_calls"
    assert isinstance(call.function.parsed_arguments, GetOrderStatus | CancelOrder)
    whole = await client.chat.completions.create(**kw, tools=TOOLS, tool_choice="required")
    (same,) = whole.choices[0].message.tool_calls or []
    assert (same.function.name, same.function.arguments) == (
        call.function.name,
        call.function.arguments,
    )


async def test_a_call_cut_by_max_tokens_is_not_a_call(
    gw: LiveGateway, client: openai.AsyncOpenAI
) -> None:
    done = await client.chat.completions.create(
        **_args(gw, max_tokens=3), tools=TOOLS, tool_choice="required"
    )
    choice = done.choices[0]
    assert choice.finish_reason == "length"
    for call in choice.message.tool_calls or []:  # streamed names may show; never a whole call
        with pytest.raises(ValueError):
            MODELS[call.function.name].model_validate_json(call.function.arguments)


async def test_a_round_trip_after_a_primed_call(
    gw: LiveGateway, client: openai.AsyncOpenAI
) -> None:
    named = {"type": "function", "function": {"name": "get_order_status"}}
    first = await client.chat.completions.create(**_args(gw), tools=TOOLS, tool_choice=named)
    (call,) = first.choices[0].message.tool_calls or []
    assistant = first.choices[0].message.model_dump(exclude_none=True)
    result = {"role": "tool", "tool_call_id": call.id, "content": json.dumps(STATUS)}
    second = await client.chat.completions.create(
        **_args(gw, max_tokens=12, messages=[*ASK, assistant, result]), tools=TOOLS
    )
    assert second.choices[0].finish_reason in ("stop", "length", "tool_calls")
    assert second.usage is not None and first.usage is not None
    assert second.usage.prompt_tokens > first.usage.prompt_tokens
