"""A client that goes away is billed what the engine generated until the abort: the usage
record and the budget count every token, streamed or not, and every step and tool call of a
gateway tool loop that ran."""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import aiohttp
import pytest
import pytest_asyncio
from sqlalchemy import text
from yarl import URL

from engine.serving.async_engine import AsyncEngine
from gateway.usage.ledger import LEDGER
from tenants.db import make_engine
from tests.gateway.chat.tools.tenant.test_tool_loop import SYSTEM, hook, named
from tests.gateway.chat.tools.tenant.webhook_server import Receiver, webhook_receiver
from tests.gateway.harness import (
    LiveGateway,
    live_gateway,
    make_settings,
    slow_engine_steps,
)
from tests.usage.helpers import wait_records

ANSWER = 400  # tokens asked for; the client leaves once the engine generated 90% of them
LEAVE_AT = ANSWER * 9 // 10
LIMITS = {"rpm": 10_000, "tpm": 10_000_000, "max_concurrency": 8, "max_output_tokens": 1000}


@pytest_asyncio.fixture
async def receiver() -> AsyncIterator[Receiver]:
    async with webhook_receiver() as r:
        yield r


@pytest_asyncio.fixture
async def gw(
    gateway_database: str,
    demo_model_dir: Path,
    tmp_path: Path,
    receiver: Receiver,
    monkeypatch: pytest.MonkeyPatch,
) -> AsyncIterator[LiveGateway]:
    env = {
        "KVGATE_USAGE_FLUSH_S": "0.05",
        "KVGATE_TOOL_ALLOWED_HOSTS": URL(receiver.url).authority,
    }
    settings = make_settings(gateway_database, tmp_path, **env)
    async with live_gateway(settings, demo_model_dir) as live:
        # every step at least 5 ms: the answer takes seconds, so the client can leave in it
        slow_engine_steps(live, monkeypatch, 0.005)
        yield live


def _engine(gw: LiveGateway) -> AsyncEngine:
    engine = gw.state.engine
    assert isinstance(engine, AsyncEngine)
    return engine


def _body(gw: LiveGateway, stream: bool) -> dict[str, Any]:
    """A long answer: EOS and the template's stop tokens biased away (random weights)."""
    tok = gw.state.tokenizer
    bias = {str(t): -100 for t in tok.eos_token_ids}
    return {
        "model": gw.state.model_name,
        "messages": [{"role": "user", "content": "Tell me a long story."}],
        "max_tokens": ANSWER,
        "temperature": 0.0,
        "logit_bias": bias,
        "stream": stream,
    }


async def _leave_when(gw: LiveGateway, key: str, body: dict[str, Any], generated: int) -> int:
    """Send ``body`` and drop the connection once the engine has computed ``generated`` more
    tokens than the prompt; the tokens the engine had generated when the client left."""
    engine = _engine(gw)
    start = engine.num_model_tokens
    session = aiohttp.ClientSession()

    async def call() -> None:
        headers = {"Authorization": f"Bearer {key}"}
        async with session.post(
            f"{gw.base_url}/v1/chat/completions", json=body, headers=headers
        ) as r:
            async for _ in r.content:
                pass

    task = asyncio.create_task(call())
    try:
        async with asyncio.timeout(60):
            while engine.num_model_tokens - start < generated:
                assert not task.done(), "the answer ended before the client left"
                await asyncio.sleep(0.002)
        left_at = engine.num_model_tokens - start
    finally:
        task.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await task
        await session.close()  # the connection goes: the gateway sees a disconnect
    return left_at


async def _record(db: str, tenant: str) -> tuple[int, int, int, str | None]:
    await wait_records(db, tenant, 1)
    engine = make_engine(db)
    try:
        async with engine.connect() as conn:
            row = (
                await conn.execute(
                    text(
                        "SELECT prompt_tokens, completion_tokens, tool_calls, error "
                        "FROM usage_records WHERE tenant_id = :t"
                    ),
                    {"t": tenant},
                )
            ).one()
    finally:
        await engine.dispose()
    return int(row[0]), int(row[1]), int(row[2]), row[3]


async def _budget_used(gw: LiveGateway, tenant: str, at_least: int) -> int:
    """The tenant's day counter once the settlement (in the background) brought it down to
    the record's tokens."""
    counters = gw.app[LEDGER].budgets.state.counters
    async with asyncio.timeout(5):
        while True:
            used = sum(c[0] for k, c in counters.items() if tenant in k)
            if used <= at_least + ANSWER:  # the reservation of the unused tokens given back
                return used
            await asyncio.sleep(0.02)


@pytest.mark.parametrize("stream", [False, True], ids=["json", "sse"])
async def test_a_client_leaving_at_90_percent_is_billed_what_the_engine_generated(
    gw: LiveGateway, gateway_database: str, stream: bool
) -> None:
    t = await gw.create_tenant("gone", limits=LIMITS)
    await gw.admin("PUT", f"/tenants/{t.id}/budget", {"day": {"max_tokens": 10**6}})
    prompt_probe = len(gw.state.tokenizer.encode("Tell me a long story."))
    left_at = await _leave_when(gw, t.key, _body(gw, stream), prompt_probe + LEAVE_AT)
    prompt, completion, _, error = await _record(gateway_database, t.id)
    generated = left_at - prompt  # what the engine had computed past the prompt
    assert error == "client_disconnected"
    assert completion >= generated >= LEAVE_AT - prompt_probe, (completion, generated)
    assert completion >= 0.9 * ANSWER - prompt_probe
    used = await _budget_used(gw, t.id, prompt + completion)
    assert used == prompt + completion, (used, prompt, completion)


async def test_a_streamed_tool_loop_cut_mid_step_bills_the_step_and_the_call(
    gw: LiveGateway, gateway_database: str, receiver: Receiver
) -> None:
    t = await gw.create_tenant("gone-tools", system_prompt=SYSTEM, limits=LIMITS)
    tools = [hook("lookup_order", f"{receiver.url}/ok")]
    version = {"text": SYSTEM, "tools": tools, "tool_choice": named("lookup_order")}
    out = await gw.admin("PUT", f"/tenants/{t.id}/system-prompt", {**version, "max_tool_rounds": 1})
    receiver.secret = out.get("webhook_secret", receiver.secret)
    await gw.wait_pinned(t.id)
    body = _body(gw, True)
    body["messages"] = [{"role": "user", "content": "Where is order 12?"}]
    # leave once the engine computed 250 tokens after the tool ran: the second step's new
    # prompt tokens (the result turn, under 130) and at least 120 of its answer
    await _leave_after_tool(gw, t.key, body, receiver, after=250)
    prompt, completion, calls, error = await _record(gateway_database, t.id)
    assert calls == 1 and error == "client_disconnected"
    assert completion >= 120, (prompt, completion)  # the cut step's tokens are billed


async def _leave_after_tool(
    gw: LiveGateway, key: str, body: dict[str, Any], receiver: Receiver, after: int
) -> None:
    engine = _engine(gw)
    before = len(receiver.calls)
    session = aiohttp.ClientSession()

    async def call() -> None:
        headers = {"Authorization": f"Bearer {key}"}
        async with session.post(
            f"{gw.base_url}/v1/chat/completions", json=body, headers=headers
        ) as r:
            async for _ in r.content:
                pass

    task = asyncio.create_task(call())
    try:
        async with asyncio.timeout(60):
            while len(receiver.calls) == before:
                await asyncio.sleep(0.002)
            mark = engine.num_model_tokens
            while engine.num_model_tokens - mark < after:
                assert not task.done(), "the answer ended before the client left"
                await asyncio.sleep(0.002)
    finally:
        task.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await task
        await session.close()
