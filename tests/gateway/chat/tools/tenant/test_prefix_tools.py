"""A tenant's tools are part of its pinned prefix (cached_tokens cover them), come before a
client's, reach widget traffic, and switch with the prompt version (rollback included)."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pytest
import pytest_asyncio

from tests.gateway.harness import ADMIN_TOKEN, LiveGateway, gateway_on_fresh_database
from tests.widget.helpers import request, widget_chat

pytestmark = pytest.mark.asyncio(loop_scope="module")

SYSTEM = "You are the order desk of a small shop. Look orders up before you answer."
SITE = "https://shop.example"
LIMITS = {"rpm": 10_000, "tpm": 10_000_000, "max_concurrency": 8, "max_output_tokens": 200}


def tool(name: str, **extra: Any) -> dict[str, Any]:
    params = {"type": "object", "properties": {"order_id": {"type": "integer"}}}
    fn = {"name": name, "description": f"{name} by order number", "parameters": params}
    return {"type": "function", "function": fn, **extra}


@pytest_asyncio.fixture(scope="module", loop_scope="module")
async def gw(
    template_database: str, demo_model_dir: Path, tmp_path_factory: pytest.TempPathFactory
) -> AsyncIterator[LiveGateway]:
    var_dir = tmp_path_factory.mktemp("prefix-tools")
    async with gateway_on_fresh_database(template_database, demo_model_dir, var_dir) as live:
        yield live


async def _tenant(gw: LiveGateway, prefix: str, **version: Any) -> tuple[str, str]:
    t = await gw.create_tenant(prefix, system_prompt=SYSTEM, limits=LIMITS)
    if version:
        await gw.admin("PUT", f"/tenants/{t.id}/system-prompt", {"text": SYSTEM, **version})
    return t.id, t.key


async def _chat(gw: LiveGateway, key: str, **extra: Any) -> dict[str, Any]:
    body = {
        "model": gw.state.model_name,
        "messages": [{"role": "user", "content": "Where is order 12?"}],
        "max_tokens": 80,
        "temperature": 0.0,
        **extra,
    }
    status, _, out = await request(
        gw, "POST", "/v1/chat/completions", json=body, Authorization=f"Bearer {key}"
    )
    assert status == 200, out
    return dict(out)


async def wait_version(gw: LiveGateway, tenant_id: str, version: int) -> None:
    """Until the pin manager serves ``version`` (the change event lands a moment later)."""
    async with asyncio.timeout(10):
        while (await gw.wait_pinned(tenant_id))["prompt_version"] != version:
            await asyncio.sleep(0.02)


def _called(out: dict[str, Any]) -> list[str]:
    calls = out["choices"][0]["message"].get("tool_calls") or []
    return [c["function"]["name"] for c in calls]


async def test_the_tools_are_inside_the_pinned_prefix(gw: LiveGateway) -> None:
    plain_id, _ = await _tenant(gw, "plain")
    tools_id, key = await _tenant(gw, "tooled", tools=[tool("lookup_order")])
    plain = await gw.wait_pinned(plain_id)
    pinned = await gw.wait_pinned(tools_id)
    assert pinned["pin_state"] == "pinned" and pinned["prompt_version"] == 2
    assert pinned["prefix_tokens"] > plain["prefix_tokens"] + 60  # the definitions are in it
    block = gw.state.engine.info.block_size
    out = await _chat(gw, key, tool_choice="required")
    assert _called(out) == ["lookup_order"]
    cached = out["usage"]["prompt_tokens_details"]["cached_tokens"]
    assert cached >= pinned["prefix_tokens"] // block * block > plain["prefix_tokens"]


async def test_client_tools_come_after_the_tenant_tools(gw: LiveGateway) -> None:
    tid, key = await _tenant(gw, "both", tools=[tool("lookup_order")])
    pinned = await gw.wait_pinned(tid)
    named = {"type": "function", "function": {"name": "open_page"}}
    out = await _chat(gw, key, tools=[tool("open_page")], tool_choice=named)
    assert _called(out) == ["open_page"]
    block = gw.state.engine.info.block_size
    cached = out["usage"]["prompt_tokens_details"]["cached_tokens"]
    assert cached >= pinned["prefix_tokens"] // block * block
    tenant_named = {"type": "function", "function": {"name": "lookup_order"}}
    assert _called(await _chat(gw, key, tool_choice=tenant_named)) == ["lookup_order"]
    body = {
        "model": gw.state.model_name,
        "messages": [{"role": "user", "content": "hi"}],
        "tools": [tool("lookup_order")],
    }
    status, _, err = await request(
        gw, "POST", "/v1/chat/completions", json=body, Authorization=f"Bearer {key}"
    )
    assert status == 400 and err["error"]["code"] == "tool_name_conflict", err


async def test_widget_traffic_gets_the_tenant_tools(gw: LiveGateway) -> None:
    tid, _ = await _tenant(gw, "wtools", tools=[tool("lookup_order")], tool_choice="required")
    key = await gw.admin(
        "POST", f"/tenants/{tid}/keys", {"kind": "widget", "allowed_origins": [SITE]}
    )
    await gw.wait_pinned(tid)
    body = {
        "model": gw.state.model_name,
        "messages": [{"role": "user", "content": "Where is order 12?"}],
        "max_tokens": 80,
    }
    status, _, out = await widget_chat(gw, key["key"], SITE, body)
    assert status == 200 and set(_called(out)) == {"lookup_order"}, out


async def test_rollback_switches_the_tools(gw: LiveGateway) -> None:
    tid, key = await _tenant(gw, "roll", tools=[tool("first_tool")], tool_choice="required")
    await gw.admin(
        "PUT",
        f"/tenants/{tid}/system-prompt",
        {"text": SYSTEM, "tools": [tool("second_tool")], "tool_choice": "required"},
    )
    assert (await gw.wait_pinned(tid))["prompt_version"] == 3
    assert _called(await _chat(gw, key)) == ["second_tool"]
    await gw.admin("POST", f"/tenants/{tid}/system-prompts/2/activate")
    await wait_version(gw, tid, 2)
    assert _called(await _chat(gw, key)) == ["first_tool"]
    await gw.admin("POST", f"/tenants/{tid}/system-prompts/1/activate")
    await wait_version(gw, tid, 1)
    assert _called(await _chat(gw, key)) == []  # version 1 has no tools


async def test_tools_that_make_the_prefix_too_long_are_refused(gw: LiveGateway) -> None:
    tid, _ = await _tenant(gw, "long")
    many = [
        {"type": "function", "function": {"name": f"tool_{i}", "description": "word " * 790}}
        for i in range(30)
    ]
    url = f"{gw.base_url}/admin/v1/tenants/{tid}/system-prompt"
    headers = {"Authorization": f"Bearer {ADMIN_TOKEN}"}
    async with gw.http.put(url, json={"text": SYSTEM, "tools": many}, headers=headers) as resp:
        err = (await resp.json())["error"]
        assert resp.status == 422 and err["code"] == "prompt_too_long", err
    assert err["param"] == "tools"
    versions = await gw.admin("GET", f"/tenants/{tid}/system-prompts")
    assert len(versions["data"]) == 1
