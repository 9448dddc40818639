"""kvgate in front of two real vLLM servers (``KVGATE_BACKEND=vllm``), through the official
``openai`` client: chat, streaming with usage, sampling parameters, structured output, a tool
round trip, tenant isolation of the prefix cache, and the ledger."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from tests.gateway.harness import LiveGateway
from tests.vllm.conftest import VllmPair
from tests.vllm.gateway import SYSTEM, cluster_of, usage_records, vllm_gateway

BLOCK = 128
USER = [{"role": "user", "content": "Is the library open on Sunday?"}]


@pytest.fixture
async def gw(
    template_database: str, vllm_pair: VllmPair, vllm_model: Path, tmp_path: Path
) -> LiveGateway:
    async with vllm_gateway(template_database, vllm_pair.servers, vllm_model, tmp_path) as live:
        yield live


async def test_chat_streams_with_usage_and_the_tenant_prefix_is_cached(gw: LiveGateway) -> None:
    a = await gw.create_tenant("lib", system_prompt=SYSTEM)
    info = await gw.wait_pinned(a.id, timeout=120)
    assert info["pin_state"] == "pinned" and info["pinned_tokens"] >= 2 * BLOCK
    client = gw.openai(a.key)
    model = gw.state.model_name
    text, usage = "", None
    stream = await client.chat.completions.create(
        model=model,
        messages=USER,
        stream=True,
        stream_options={"include_usage": True},
        max_tokens=12,
        temperature=0,
    )
    async for chunk in stream:
        if chunk.choices:
            text += chunk.choices[0].delta.content or ""
        if chunk.usage is not None:
            usage = chunk.usage
    assert usage is not None and usage.completion_tokens >= 1 and text
    # prewarmed on its placed replica and routed there: the tenant prefix's blocks are cached
    assert usage.prompt_tokens_details.cached_tokens >= info["pinned_tokens"]
    again = await client.chat.completions.create(model=model, messages=USER, max_tokens=4)
    assert again.usage.prompt_tokens_details.cached_tokens >= info["pinned_tokens"]
    # tenant B sends A's exact text (its system prompt as a client system message): same
    # tokens, another cache salt: nothing of A's is served to it
    b = await gw.create_tenant("other")
    other = gw.openai(b.key)
    msgs = [{"role": "system", "content": SYSTEM}, *USER]
    first_b = await other.chat.completions.create(model=model, messages=msgs, max_tokens=4)
    assert first_b.usage.prompt_tokens == again.usage.prompt_tokens  # the same prompt
    assert first_b.usage.prompt_tokens_details.cached_tokens == 0
    records = await usage_records(gw, a.id, 2)
    by_id = {r["request_id"]: r for r in records}
    rec = by_id[again.id]
    assert (rec["prompt_tokens"], rec["cached_tokens"], rec["completion_tokens"]) == (
        again.usage.prompt_tokens,
        again.usage.prompt_tokens_details.cached_tokens,
        again.usage.completion_tokens,
    )
    assert rec["worker"] in {s for s in cluster_of(gw).members}
    # the cluster page shows the vLLM replicas, their load and their tenants
    report = await gw.admin("GET", "/cluster")
    assert report["backend"] == "vllm" and len(report["workers"]) == 2
    assert all(w["healthy"] and w["blocks_total"] > 0 for w in report["workers"])
    holders = [w for w in report["workers"] if a.id in w["pinned_tenants"]]
    assert [w["worker_id"] for w in holders] == info["pinned_on"]
    assert report["tenants"][a.id]["pinned_on"] == info["pinned_on"]


async def test_sampling_parameters_through_vllm(gw: LiveGateway) -> None:
    t = await gw.create_tenant("samp", system_prompt=SYSTEM)
    client = gw.openai(t.key)
    model = gw.state.model_name
    greedy = await client.chat.completions.create(
        model=model, messages=USER, max_tokens=6, temperature=0, logprobs=True, top_logprobs=3
    )
    content = greedy.choices[0].logprobs.content
    assert content and len(content) == greedy.usage.completion_tokens
    assert all(len(c.top_logprobs) == 3 and c.logprob <= 0 for c in content)
    # n choices with a seed: each its own index, the seed repeats them
    kwargs = {"model": model, "messages": USER, "max_tokens": 8, "temperature": 1.0, "seed": 5}
    one = await client.chat.completions.create(n=2, **kwargs)
    two = await client.chat.completions.create(n=2, **kwargs)
    assert sorted(c.index for c in one.choices) == [0, 1]
    assert [c.message.content for c in one.choices] == [c.message.content for c in two.choices]
    # a stop string ends the text before it
    full = greedy.choices[0].message.content or ""
    if len(full) > 4:
        stop = full[2:4]
        cut = await client.chat.completions.create(
            model=model, messages=USER, max_tokens=6, temperature=0, stop=[stop]
        )
        assert cut.choices[0].message.content == full[: full.index(stop)]
    # logit_bias forces a token
    forced_id = 4093  # an ordinary token
    forced = await client.chat.completions.create(
        model=model, messages=USER, max_tokens=3, temperature=0, logit_bias={str(forced_id): 100}
    )
    assert forced.choices[0].message.content == gw.state.tokenizer.decode([forced_id] * 3)


async def test_structured_output_and_a_tool_round_trip(gw: LiveGateway) -> None:
    t = await gw.create_tenant("tools", system_prompt=SYSTEM)
    client = gw.openai(t.key)
    model = gw.state.model_name
    schema = {
        "type": "object",
        "properties": {"open": {"type": "boolean"}},
        "required": ["open"],
        "additionalProperties": False,
    }
    fmt = {"type": "json_schema", "json_schema": {"name": "answer", "schema": schema}}
    reply = await client.chat.completions.create(
        model=model, messages=USER, max_tokens=30, temperature=0, response_format=fmt
    )
    value = json.loads(reply.choices[0].message.content or "")
    assert list(value) == ["open"] and isinstance(value["open"], bool)
    tools = [
        {
            "type": "function",
            "function": {
                "name": "opening_hours",
                "description": "The library's opening hours on a weekday",
                "parameters": {
                    "type": "object",
                    "properties": {"day": {"type": "string"}},
                    "required": ["day"],
                },
            },
        }
    ]
    # tool_choice auto: vLLM cannot hold the model to the call grammar; the gateway still
    # parses the answer for calls
    first = await client.chat.completions.create(
        model=model, messages=USER, tools=tools, max_tokens=40, temperature=0
    )
    assert first.choices[0].finish_reason in ("stop", "length", "tool_calls")
    # the round trip: the call and its result sent back, the model answers from them
    call = {
        "id": "call_1",
        "type": "function",
        "function": {"name": "opening_hours", "arguments": json.dumps({"day": "Sunday"})},
    }
    turns = [
        *USER,
        {"role": "assistant", "content": None, "tool_calls": [call]},
        {"role": "tool", "tool_call_id": "call_1", "content": "Sunday: closed"},
    ]
    answer = await client.chat.completions.create(
        model=model, messages=turns, tools=tools, max_tokens=20, temperature=0
    )
    assert answer.usage.prompt_tokens > first.usage.prompt_tokens
    assert answer.choices[0].message.content or answer.choices[0].message.tool_calls
    # a forced call: primed (the call block's opening ends the prompt) and held to the call's
    # JSON schema by vLLM's structured outputs; required and named alike
    named = {"type": "function", "function": {"name": "opening_hours"}}
    for choice in ("required", named):
        forced = await client.chat.completions.create(
            model=model,
            messages=USER,
            tools=tools,
            tool_choice=choice,
            parallel_tool_calls=False,  # one call: the answer ends well within max_tokens
            max_tokens=100,
            temperature=0,
        )
        assert forced.choices[0].finish_reason == "tool_calls", forced
        for call in forced.choices[0].message.tool_calls or []:
            assert call.function.name == "opening_hours"
            assert isinstance(json.loads(call.function.arguments)["day"], str)


async def test_visitors_share_the_cache_unless_salted_each(gw: LiveGateway) -> None:
    """Off (the default): visitors of a tenant share its salt, so visitor B sending visitor A's
    exact text is served A's blocks. On (``vllm_visitor_salt``): a salt per visitor, so B gets
    nothing cached, not even the tenant prefix, which each visitor computes for itself."""
    model = gw.state.model_name
    shared = await gw.create_tenant("visitors-shared", system_prompt=SYSTEM)
    split = await gw.create_tenant("visitors-split", system_prompt=SYSTEM)
    await gw.admin("PATCH", f"/tenants/{split.id}", {"vllm_visitor_salt": True})
    info = await gw.wait_pinned(shared.id, timeout=120)
    await gw.wait_pinned(split.id, timeout=120)

    async def cached(key: str, user: str) -> int:
        out = await gw.openai(key).chat.completions.create(
            model=model, messages=USER, max_tokens=2, temperature=0, user=user
        )
        assert out.usage is not None and out.usage.prompt_tokens_details is not None
        return out.usage.prompt_tokens_details.cached_tokens or 0

    # off: ann's text is served to bob from the tenant's blocks (its prefix at least)
    assert await cached(shared.key, "ann") >= info["pinned_tokens"]
    assert await cached(shared.key, "bob") >= info["pinned_tokens"]
    # on: the tenant prefix prewarmed under the tenant's salt is no visitor's
    assert await cached(split.key, "ann") == 0
    assert await cached(split.key, "ann") >= BLOCK  # ann's own blocks: her salt is stable
    assert await cached(split.key, "bob") == 0  # ann's exact text, nothing of hers
