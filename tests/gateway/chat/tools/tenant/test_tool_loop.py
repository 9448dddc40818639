"""The gateway runs a tenant's webhook tools (a real receiver on loopback, allowlisted) and
continues: results as ``tool`` turns, only their tokens prefilled, failures as answers, the round
limit, tools without a source handed to the client."""

from __future__ import annotations

import asyncio
import itertools
from collections.abc import AsyncIterator
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any
from urllib.parse import urlencode

import openai
import pytest
import pytest_asyncio
from yarl import URL

from gateway.context import TELEMETRY
from tests.gateway.chat.tools.tenant.webhook_server import Receiver, webhook_receiver
from tests.gateway.harness import (
    LiveGateway,
    create_database,
    drop_database,
    enforce_as_vllm,
    live_gateway,
    make_settings,
    pg_url,
    wait_for,
)

pytestmark = pytest.mark.asyncio(loop_scope="module")

SYSTEM = "You are the order desk of a small shop. Look orders up before you answer."
LIMITS = {"rpm": 10_000, "tpm": 10_000_000, "max_concurrency": 8, "max_output_tokens": 400}
EMPTY = {"type": "object", "properties": {}, "additionalProperties": False}
ASK = [{"role": "user", "content": "Where is order 12?"}]


@pytest_asyncio.fixture(scope="module", loop_scope="module")
async def receiver() -> AsyncIterator[Receiver]:
    async with webhook_receiver() as r:
        yield r


@pytest_asyncio.fixture(scope="module", loop_scope="module")
async def gw(
    receiver: Receiver,
    template_database: str,
    demo_model_dir: Path,
    tmp_path_factory: pytest.TempPathFactory,
) -> AsyncIterator[LiveGateway]:
    env = {
        "KVGATE_TOOL_ALLOWED_HOSTS": URL(receiver.url).authority,
        "KVGATE_TOOL_TIMEOUT_S": "0.5",
    }
    name = await create_database(template_database)
    try:
        settings = make_settings(pg_url(name), tmp_path_factory.mktemp("loop"), **env)
        async with live_gateway(settings, demo_model_dir) as live:
            yield live
    finally:
        await drop_database(name)


def hook(name: str, url: str, **extra: Any) -> dict[str, Any]:
    params = {
        "type": "object",
        "properties": {"order_id": {"type": "integer", "minimum": 1, "maximum": 99}},
        "required": ["order_id"],
        "additionalProperties": False,
    }
    fn = {"name": name, "description": f"{name} by order number", "parameters": params}
    return {"type": "function", "function": fn, "source": {"webhook": url}, **extra}


def named(name: str) -> dict[str, Any]:
    return {"type": "function", "function": {"name": name}}


async def _tenant(gw: LiveGateway, receiver: Receiver, **version: Any) -> openai.AsyncOpenAI:
    t = await gw.create_tenant("loop", system_prompt=SYSTEM, limits=LIMITS)
    out = await gw.admin("PUT", f"/tenants/{t.id}/system-prompt", {"text": SYSTEM, **version})
    receiver.secret = out.get("webhook_secret", receiver.secret)
    await gw.wait_pinned(t.id)
    return gw.openai(t.key)


async def _ask(gw: LiveGateway, client: openai.AsyncOpenAI, **extra: Any) -> Any:
    args = {"model": gw.state.model_name, "messages": ASK, "max_tokens": 60, "temperature": 0.0}
    return await client.chat.completions.create(**{**args, **extra})


def _extra(done: Any) -> tuple[list[dict[str, Any]], list[dict[str, int]]]:
    extra = done.model_extra or {}
    return extra["kvgate_tool_runs"], extra["kvgate_steps"]


async def test_a_webhook_tool_runs_and_the_answer_continues(
    gw: LiveGateway, receiver: Receiver
) -> None:
    tools = [hook("lookup_order", f"{receiver.url}/ok", status_text="Looking it up...")]
    client = await _tenant(
        gw, receiver, tools=tools, tool_choice=named("lookup_order"), max_tool_rounds=1
    )
    before = len(receiver.calls)
    done = await _ask(gw, client)
    runs, steps = _extra(done)
    assert [(r["name"], r["status"], r["round"]) for r in runs] == [("lookup_order", "ok", 1)]
    call = receiver.calls[before]
    assert (
        call.verified
        and call.body["tool"] == "lookup_order"
        and call.body["call_id"] == runs[0]["id"]
    )
    assert 1 <= call.body["arguments"]["order_id"] <= 99
    choice = done.choices[0]
    assert choice.message.tool_calls is None and choice.finish_reason in ("stop", "length")
    assert len(steps) == 2
    # The continuation reuses the KV of everything before the result: the first step's prompt
    # and answer (full blocks; the answer's last token was sampled, never fed back, so it has
    # no KV yet); only the result turn and the generation prompt are new.
    block = gw.state.engine.info.block_size
    first, second = steps
    assert (
        second["cached_tokens"]
        >= (first["prompt_tokens"] + first["completion_tokens"] - 1) // block * block
    )
    result_turn = second["prompt_tokens"] - first["prompt_tokens"] - first["completion_tokens"]
    assert 0 < result_turn < 120, steps  # the result JSON and the turn around it
    new = second["prompt_tokens"] - second["cached_tokens"]
    assert new <= result_turn + block, steps  # and the answer's last (partial) block
    usage = done.usage
    assert usage.prompt_tokens == first["prompt_tokens"] + second["prompt_tokens"]
    assert (
        usage.prompt_tokens_details.cached_tokens
        == first["cached_tokens"] + second["cached_tokens"]
    )


async def test_a_primed_forced_call_runs_and_continues_on_a_json_schema_engine(
    gw: LiveGateway, receiver: Receiver, monkeypatch: pytest.MonkeyPatch
) -> None:
    """As vLLM serves a tenant's forced tool (no Lark: the call primed, its JSON schema held):
    the call is valid, it runs, and the next step continues the first one's KV."""
    enforce_as_vllm(monkeypatch)
    tools = [hook("lookup_order", f"{receiver.url}/ok")]
    client = await _tenant(
        gw, receiver, tools=tools, tool_choice=named("lookup_order"), max_tool_rounds=1
    )
    before = len(receiver.calls)
    done = await _ask(gw, client, temperature=1.0, seed=5)
    runs, steps = _extra(done)
    assert [(r["name"], r["status"], r["round"]) for r in runs] == [("lookup_order", "ok", 1)]
    assert 1 <= receiver.calls[before].body["arguments"]["order_id"] <= 99
    assert len(steps) == 2 and done.choices[0].message.tool_calls is None
    block = gw.state.engine.info.block_size
    first, second = steps
    assert (
        second["cached_tokens"]
        >= (first["prompt_tokens"] + first["completion_tokens"] - 1) // block * block
    )
    # the result turn, and the closing tag the primed answer never wrote
    result_turn = second["prompt_tokens"] - first["prompt_tokens"] - first["completion_tokens"]
    assert 0 < result_turn < 120, steps


async def test_the_round_limit_ends_the_loop(gw: LiveGateway, receiver: Receiver) -> None:
    tools = [hook("lookup_order", f"{receiver.url}/ok")]
    client = await _tenant(
        gw, receiver, tools=tools, tool_choice=named("lookup_order"), max_tool_rounds=3
    )
    # max_tokens bounds the whole turn (docs/tools.md): room for three calls and an answer
    done = await _ask(gw, client, max_tokens=300)
    runs, steps = _extra(done)
    assert [r["round"] for r in runs] == [1, 2, 3] and len(steps) == 4
    assert all(r["status"] == "ok" for r in runs)
    assert done.choices[0].message.tool_calls is None
    block = gw.state.engine.info.block_size
    for before, after in itertools.pairwise(steps):
        assert (
            after["cached_tokens"]
            >= (before["prompt_tokens"] + before["completion_tokens"] - 1) // block * block
        )


@pytest.mark.parametrize(
    ("path", "status"),
    [("/slow", "tool_timeout"), ("/fail", "tool_error"), ("/huge", "tool_result_too_large")],
)
async def test_failing_tools_are_answers_not_errors(
    gw: LiveGateway, receiver: Receiver, path: str, status: str
) -> None:
    tools = [hook("lookup_order", receiver.url + path)]
    client = await _tenant(
        gw, receiver, tools=tools, tool_choice=named("lookup_order"), max_tool_rounds=1
    )
    done = await _ask(gw, client)
    runs, steps = _extra(done)
    assert [r["status"] for r in runs] == [status] and len(steps) == 2
    assert done.choices[0].finish_reason in ("stop", "length")


async def test_loopback_by_name_is_refused_through_the_loop(
    gw: LiveGateway, receiver: Receiver
) -> None:
    port = URL(receiver.url).port
    tools = [hook("lookup_order", f"http://localhost:{port}/ok")]  # only 127.0.0.1:port is allowed
    client = await _tenant(
        gw, receiver, tools=tools, tool_choice=named("lookup_order"), max_tool_rounds=1
    )
    before = len(receiver.calls)
    runs, _ = _extra(await _ask(gw, client))
    assert [r["status"] for r in runs] == ["tool_endpoint_refused"]
    assert len(receiver.calls) == before


async def test_tools_without_a_source_go_back_to_the_client(
    gw: LiveGateway, receiver: Receiver
) -> None:
    client_side = {
        "type": "function",
        "function": {"name": "open_page", "parameters": EMPTY},
    }
    tools = [hook("lookup_order", f"{receiver.url}/ok"), client_side]
    client = await _tenant(gw, receiver, tools=tools, tool_choice=named("open_page"))
    done = await _ask(gw, client)
    runs, steps = _extra(done)
    assert runs == [] and len(steps) == 1
    (call,) = done.choices[0].message.tool_calls
    assert call.function.name == "open_page" and done.choices[0].finish_reason == "tool_calls"


async def test_streamed_the_loop_shows_each_run_and_continues(
    gw: LiveGateway, receiver: Receiver
) -> None:
    tools = [hook("lookup_order", f"{receiver.url}/ok", status_text="Looking up your order...")]
    client = await _tenant(
        gw, receiver, tools=tools, tool_choice=named("lookup_order"), max_tool_rounds=2
    )
    # max_tokens bounds the whole turn: room for two calls and an answer
    args = {"model": gw.state.model_name, "messages": ASK, "max_tokens": 200, "temperature": 0.0}
    chunks = [
        c
        async for c in await client.chat.completions.create(
            **args, stream=True, stream_options={"include_usage": True}
        )
    ]
    extras = [c.model_extra or {} for c in chunks]
    statuses = [e["kvgate_tool_status"] for e in extras if "kvgate_tool_status" in e]
    assert [(s["state"], s.get("text"), s.get("status")) for s in statuses] == [
        ("running", "Looking up your order...", None),
        ("done", None, "ok"),
    ] * 2
    (summary,) = [e for e in extras if "kvgate_tool_runs" in e]
    assert [r["round"] for r in summary["kvgate_tool_runs"]] == [1, 2]
    assert len(summary["kvgate_steps"]) == 3
    deltas = [c.choices[0].delta for c in chunks if c.choices]
    assert not any(d.tool_calls for d in deltas)  # the gateway's calls are never the client's
    finish = [
        c.choices[0].finish_reason for c in chunks if c.choices and c.choices[0].finish_reason
    ]
    assert finish in (["stop"], ["length"])
    usage = chunks[-1].usage
    assert usage is not None
    assert usage.prompt_tokens == sum(s["prompt_tokens"] for s in summary["kvgate_steps"])


async def test_each_call_is_a_span_and_a_histogram_observation(
    gw: LiveGateway, receiver: Receiver
) -> None:
    tools = [hook("lookup_order", f"{receiver.url}/fail")]
    client = await _tenant(
        gw, receiver, tools=tools, tool_choice=named("lookup_order"), max_tool_rounds=1
    )
    gw.spans.clear()
    done = await _ask(gw, client)
    (run,) = _extra(done)[0]
    spans = [s for s in gw.spans.get_finished_spans() if s.name == "execute_tool lookup_order"]
    (span,) = spans
    attrs = dict(span.attributes or {})
    assert attrs["gen_ai.operation.name"] == "execute_tool"
    assert attrs["gen_ai.tool.call.id"] == run["id"] and attrs["error.type"] == "tool_error"

    def chat_spans() -> list[Any]:
        return [s for s in gw.spans.get_finished_spans() if s.name.startswith("chat ")]

    await wait_for(chat_spans)  # the request span ends after the answer was written
    chat = chat_spans()
    assert span.parent is not None and span.parent.span_id == chat[0].context.span_id
    tenant = attrs["kvgate.tenant.id"]
    metrics = gw.app[TELEMETRY].metrics.render().decode()
    line = f'kvgate_tool_call_seconds_count{{status="tool_error",tenant="{tenant}"}} 1.0'
    assert line in metrics


async def test_the_usage_record_counts_the_tool_calls(gw: LiveGateway, receiver: Receiver) -> None:
    t = await gw.create_tenant("ledger", system_prompt=SYSTEM, limits=LIMITS)
    version = {
        "text": SYSTEM,
        "tools": [hook("lookup_order", f"{receiver.url}/ok")],
        "tool_choice": named("lookup_order"),
        "max_tool_rounds": 2,
    }
    out = await gw.admin("PUT", f"/tenants/{t.id}/system-prompt", version)
    receiver.secret = out["webhook_secret"]
    await gw.wait_pinned(t.id)
    done = await _ask(gw, gw.openai(t.key), max_tokens=200)  # two calls' room (the whole turn)
    runs, _ = _extra(done)
    hour = datetime.now(UTC).replace(minute=0, second=0, microsecond=0)
    stamp = "%Y-%m-%dT%H:00:00Z"
    window = {"start": (hour - timedelta(hours=1)).strftime(stamp)}
    window["end"] = (hour + timedelta(hours=2)).strftime(stamp)
    async with asyncio.timeout(30):
        while True:
            page = await gw.admin("GET", f"/tenants/{t.id}/usage/records?{urlencode(window)}")
            mine = [r for r in page["data"] if r["request_id"] == done.id]
            if mine:
                break
            await asyncio.sleep(0.1)
    (record,) = mine
    assert record["tool_calls"] == len(runs) == 2
    assert record["prompt_tokens"] == done.usage.prompt_tokens
