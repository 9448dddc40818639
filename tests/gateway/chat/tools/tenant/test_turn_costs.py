"""What a turn of gateway-run tools may cost: every step admitted by the budgets and TPM before
it runs, the request's max_tokens bounding the whole turn, a step that cannot fit the context
never run, a call cut by max_tokens never run, and every token billed (docs/tools.md, "What a
turn may cost")."""

from __future__ import annotations

import asyncio
import json
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pytest
import pytest_asyncio
from yarl import URL

from gateway.usage.ledger import LEDGER
from tenants.db import make_engine
from tests.gateway.chat.tools.tenant.test_tool_loop import ASK, SYSTEM, hook, named
from tests.gateway.chat.tools.tenant.webhook_server import Receiver, webhook_receiver
from tests.gateway.harness import (
    LiveGateway,
    TenantHandle,
    create_database,
    drop_database,
    live_gateway,
    make_settings,
    pg_url,
)
from tests.usage.helpers import ledger_totals, wait_records

pytestmark = pytest.mark.asyncio(loop_scope="module")

LIMITS = {"rpm": 10_000, "tpm": 10_000_000, "max_concurrency": 16, "max_output_tokens": 400}
BUDGET = 2_000
MAX_TOKENS = 60
CUT = 37  # tokens of '<tool_call>\n{"name": "lookup_order", "arguments": ' (demo tokenizer)


@pytest_asyncio.fixture(scope="module", loop_scope="module")
async def receiver() -> AsyncIterator[Receiver]:
    async with webhook_receiver() as r:
        yield r


@pytest_asyncio.fixture(scope="module", loop_scope="module")
async def db(template_database: str) -> AsyncIterator[str]:
    name = await create_database(template_database)
    try:
        yield pg_url(name)
    finally:
        await drop_database(name)


@pytest_asyncio.fixture(scope="module", loop_scope="module")
async def gw(
    receiver: Receiver, db: str, demo_model_dir: Path, tmp_path_factory: pytest.TempPathFactory
) -> AsyncIterator[LiveGateway]:
    env = {
        "KVGATE_TOOL_ALLOWED_HOSTS": URL(receiver.url).authority,
        "KVGATE_USAGE_FLUSH_S": "0.05",
        "KVGATE_KV_CACHE_BYTES": str(32 << 20),  # a pinned prompt per test, and long turns
    }
    settings = make_settings(db, tmp_path_factory.mktemp("costs"), **env)
    async with live_gateway(settings, demo_model_dir) as live:
        yield live


async def _tenant(gw: LiveGateway, receiver: Receiver, path: str, **version: Any) -> TenantHandle:
    tools = [hook("lookup_order", f"{receiver.url}{path}")]
    t = await gw.create_tenant("costs", system_prompt=SYSTEM, limits=LIMITS)
    out = await gw.admin(
        "PUT",
        f"/tenants/{t.id}/system-prompt",
        {"text": SYSTEM, "tools": tools, "tool_choice": named("lookup_order"), **version},
    )
    receiver.secret = out.get("webhook_secret", receiver.secret)
    await gw.wait_pinned(t.id)
    return t


async def _post(gw: LiveGateway, key: str, **extra: Any) -> tuple[int, dict[str, Any]]:
    body = {"model": gw.state.model_name, "messages": ASK, "max_tokens": MAX_TOKENS, **extra}
    body["temperature"] = 0.0
    headers = {"Authorization": f"Bearer {key}"}
    async with gw.http.post(f"{gw.base_url}/v1/chat/completions", json=body, headers=headers) as r:
        return r.status, await r.json()


async def _stream(gw: LiveGateway, key: str, **extra: Any) -> list[dict[str, Any]]:
    body = {"model": gw.state.model_name, "messages": ASK, "max_tokens": MAX_TOKENS, **extra}
    body.update(temperature=0.0, stream=True, stream_options={"include_usage": True})
    headers = {"Authorization": f"Bearer {key}"}
    events = []
    async with gw.http.post(f"{gw.base_url}/v1/chat/completions", json=body, headers=headers) as r:
        assert r.status == 200, await r.text()
        async for line in r.content:
            text = line.decode().strip()
            if text.startswith("data: ") and text != "data: [DONE]":
                events.append(json.loads(text[6:]))
    return events


async def test_a_race_of_tool_loops_ends_at_most_one_step_over_the_budget(
    gw: LiveGateway, receiver: Receiver, db: str
) -> None:
    """8 concurrent 4-round loops against a 2,000-token day budget: each later step reserves
    its prompt and its most completion tokens before it runs, so the budget ends at most one
    step's reservation over (it admits while not yet spent)."""
    t = await _tenant(gw, receiver, "/ok", max_tool_rounds=4)
    await gw.admin("PUT", f"/tenants/{t.id}/budget", {"day": {"max_tokens": BUDGET}})
    results = await asyncio.gather(*(_post(gw, t.key) for _ in range(8)))
    answered = [doc for status, doc in results if status == 200]
    assert answered and all(s in (200, 429) for s, _ in results), results
    steps = [s for doc in answered for s in doc["kvgate_steps"]]
    reservation = max(s["prompt_tokens"] for s in steps) + MAX_TOKENS
    totals = await wait_records(db, t.id, len(results))
    used = totals[1] + totals[3]  # prompt + completion tokens of every record
    assert used <= BUDGET + reservation, (used, reservation)
    # the turns the budget cut end with what they have, "length" and the refusal named
    cut = [doc for doc in answered if "kvgate_error" in doc]
    assert cut, "no loop was cut by the budget"
    for doc in cut:
        assert doc["choices"][0]["finish_reason"] == "length"
        assert doc["kvgate_error"]["code"] == "budget_exceeded"
    billed = sum(d["usage"]["prompt_tokens"] + d["usage"]["completion_tokens"] for d in answered)
    assert billed == used  # the ledger bills what the clients were told
    counters = gw.app[LEDGER].budgets.state.counters
    await _settled(lambda: sum(c[0] for k, c in counters.items() if t.id in k) == used)


async def _settled(cond: Any, timeout: float = 5.0) -> None:
    """Budget settlements run in the background: wait until ``cond`` holds."""
    async with asyncio.timeout(timeout):
        while not cond():
            await asyncio.sleep(0.02)


async def test_a_streamed_loop_cut_by_the_budget_ends_with_an_error_event(
    gw: LiveGateway, receiver: Receiver
) -> None:
    """A budget of one token admits the first step (the budget is not yet spent) and no later
    one: the stream ends with the round that ran, finish "length", then the refusal."""
    t = await _tenant(gw, receiver, "/ok", max_tool_rounds=4)
    await gw.admin("PUT", f"/tenants/{t.id}/budget", {"day": {"max_tokens": 1}})
    events = await _stream(gw, t.key)
    finishes = [c["finish_reason"] for e in events for c in e.get("choices", [])]
    assert finishes[-1] == "length", events
    assert "error" in events[-1] and events[-1]["error"]["code"] == "budget_exceeded", events
    runs = [e for e in events if "kvgate_tool_runs" in e]
    assert len(runs) == 1 and len(runs[0]["kvgate_tool_runs"]) == 1  # the round that ran
    status, refused = await _post(gw, t.key)  # spent now: refused before any step
    assert status == 429 and refused["error"]["code"] == "budget_exceeded"


async def test_max_tokens_bounds_the_whole_turn(gw: LiveGateway, receiver: Receiver) -> None:
    t = await _tenant(gw, receiver, "/ok", max_tool_rounds=4)
    for stream in (False, True):
        if stream:
            events = await _stream(gw, t.key, max_tokens=100)
            usage = next(e["usage"] for e in events if e.get("usage"))
            steps = next(e["kvgate_steps"] for e in events if "kvgate_steps" in e)
        else:
            status, doc = await _post(gw, t.key, max_tokens=100)
            assert status == 200, doc
            usage, steps = doc["usage"], doc["kvgate_steps"]
        assert len(steps) >= 2  # the loop ran
        assert usage["completion_tokens"] <= 100, (usage, steps)
        assert usage["completion_tokens"] == sum(s["completion_tokens"] for s in steps)


async def test_a_step_that_cannot_fit_the_context_is_not_run(
    gw: LiveGateway, receiver: Receiver
) -> None:
    """A tool answer that fills the context: the turn ends with "length" and what it has,
    never a 400 after the tool ran."""
    t = await _tenant(gw, receiver, "/big", max_tool_rounds=2)
    before = len(receiver.calls)
    status, doc = await _post(gw, t.key)
    assert status == 200, doc
    assert receiver.paths()[before:] == ["/big"]
    choice = doc["choices"][0]
    assert choice["finish_reason"] == "length" and choice["message"].get("tool_calls") is None
    assert len(doc["kvgate_steps"]) == 1 and len(doc["kvgate_tool_runs"]) == 1
    events = await _stream(gw, t.key)
    assert not any("error" in e for e in events), events
    assert [c["finish_reason"] for e in events for c in e.get("choices", [])][-1] == "length"


async def test_a_call_cut_by_max_tokens_never_runs(gw: LiveGateway, receiver: Receiver) -> None:
    """Cut right after ``"arguments":`` (the call's name is complete, its arguments are not
    begun): the call is not run with ``{}``; the answer ends with "length"."""
    t = await _tenant(gw, receiver, "/ok", max_tool_rounds=2)
    before = len(receiver.calls)
    for stream in (False, True):
        if stream:
            events = await _stream(gw, t.key, max_tokens=CUT)
            finishes = [c["finish_reason"] for e in events for c in e.get("choices", [])]
            assert finishes[-1] == "length", events
        else:
            status, doc = await _post(gw, t.key, max_tokens=CUT)
            assert status == 200, doc
            choice = doc["choices"][0]
            assert choice["finish_reason"] == "length", doc
            assert doc["kvgate_tool_runs"] == [] and len(doc["kvgate_steps"]) == 1
    assert len(receiver.calls) == before  # nothing was sent to the tool


async def test_tool_calls_and_every_step_are_billed(
    gw: LiveGateway, receiver: Receiver, db: str
) -> None:
    t = await _tenant(gw, receiver, "/ok", max_tool_rounds=3)
    status, doc = await _post(gw, t.key, max_tokens=200)
    assert status == 200, doc
    await wait_records(db, t.id, 1)
    engine = make_engine(db)
    try:
        totals = await ledger_totals(engine, t.id)
        async with engine.connect() as conn:
            from sqlalchemy import text

            calls = (
                await conn.execute(
                    text("SELECT tool_calls FROM usage_records WHERE tenant_id = :t"), {"t": t.id}
                )
            ).scalar_one()
    finally:
        await engine.dispose()
    assert calls == len(doc["kvgate_tool_runs"]) == 3
    assert totals[1] == doc["usage"]["prompt_tokens"]
    assert totals[3] == doc["usage"]["completion_tokens"]
