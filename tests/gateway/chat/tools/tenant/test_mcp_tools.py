"""MCP servers of a tenant (a real ``MCPServer`` over streamable HTTP on loopback): added with
their tools listed through the official SDK, then called with tools/call by the tool loop."""

from __future__ import annotations

from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pytest
import pytest_asyncio
from yarl import URL

from tests.gateway.chat.tools.tenant.mcp_server import TOKEN, McpTestServer, mcp_server
from tests.gateway.harness import (
    ADMIN_TOKEN,
    LiveGateway,
    create_database,
    drop_database,
    live_gateway,
    make_settings,
    pg_url,
)

pytestmark = pytest.mark.asyncio(loop_scope="module")

SYSTEM = "You are the order desk of a small shop."
LIMITS = {"rpm": 10_000, "tpm": 10_000_000, "max_concurrency": 8, "max_output_tokens": 200}


@pytest_asyncio.fixture(scope="module", loop_scope="module")
async def mcp() -> AsyncIterator[McpTestServer]:
    async with mcp_server() as server:
        yield server


@pytest_asyncio.fixture(scope="module", loop_scope="module")
async def gw(
    mcp: McpTestServer,
    template_database: str,
    demo_model_dir: Path,
    tmp_path_factory: pytest.TempPathFactory,
) -> AsyncIterator[LiveGateway]:
    name = await create_database(template_database)
    try:
        env = {"KVGATE_TOOL_ALLOWED_HOSTS": URL(mcp.url).authority}
        settings = make_settings(pg_url(name), tmp_path_factory.mktemp("mcp"), **env)
        async with live_gateway(settings, demo_model_dir) as live:
            yield live
    finally:
        await drop_database(name)


async def _raw(gw: LiveGateway, method: str, path: str, body: Any = None) -> tuple[int, Any]:
    headers = {"Authorization": f"Bearer {ADMIN_TOKEN}"}
    url = f"{gw.base_url}/admin/v1{path}"
    async with gw.http.request(method, url, json=body, headers=headers) as resp:
        return resp.status, await resp.json()


async def test_add_a_server_and_the_loop_calls_its_tool(
    gw: LiveGateway, mcp: McpTestServer
) -> None:
    t = await gw.create_tenant("mcp", system_prompt=SYSTEM, limits=LIMITS)
    status, added = await _raw(
        gw, "POST", f"/tenants/{t.id}/mcp-servers", {"url": mcp.url, "bearer": TOKEN}
    )
    assert status == 201, added
    assert added["id"].startswith("mcp_")
    listed = {tool["name"]: tool for tool in added["tools"]}
    assert set(listed) == {"lookup_order", "cancel_order"}
    assert listed["lookup_order"]["input_schema"]["properties"]["order_id"]["type"] == "integer"
    status, servers = await _raw(gw, "GET", f"/tenants/{t.id}/mcp-servers")
    assert status == 200 and [s["id"] for s in servers["data"]] == [added["id"]]
    assert TOKEN not in str(servers)
    schema = listed["lookup_order"]["input_schema"]
    schema = {
        **schema,
        "properties": {"order_id": {"type": "integer", "minimum": 1, "maximum": 99}},
    }
    tool = {
        "type": "function",
        "function": {
            "name": "lookup_order",
            "description": "Look an order up",
            "parameters": schema,
        },
        "source": {"mcp": added["id"]},
    }
    version = {
        "text": SYSTEM,
        "tools": [tool],
        "tool_choice": {"type": "function", "function": {"name": "lookup_order"}},
        "max_tool_rounds": 1,
    }
    await gw.admin("PUT", f"/tenants/{t.id}/system-prompt", version)
    await gw.wait_pinned(t.id)
    client = gw.openai(t.key)
    done = await client.chat.completions.create(
        model=gw.state.model_name,
        messages=[{"role": "user", "content": "Where is order 12?"}],
        max_tokens=60,
        temperature=0.0,
    )
    runs = (done.model_extra or {})["kvgate_tool_runs"]
    assert [(r["name"], r["status"]) for r in runs] == [("lookup_order", "ok")]
    assert mcp.calls and mcp.calls[-1]["tool"] == "lookup_order"
    assert 1 <= mcp.calls[-1]["order_id"] <= 99
    assert all(a == f"Bearer {TOKEN}" for a in mcp.authorizations[-3:])


async def test_refusals(gw: LiveGateway, mcp: McpTestServer) -> None:
    t = await gw.create_tenant("mcpbad", system_prompt=SYSTEM, limits=LIMITS)
    path = f"/tenants/{t.id}/mcp-servers"
    status, err = await _raw(gw, "POST", path, {"url": mcp.url, "bearer": "wrong"})
    assert status == 400 and err["error"]["code"] == "mcp_server_unreachable", err
    port = URL(mcp.url).port
    seen = len(mcp.authorizations)
    status, err = await _raw(gw, "POST", path, {"url": f"http://localhost:{port}/mcp"})
    assert status == 400 and err["error"]["code"] == "mcp_server_unreachable", err
    assert "https" in err["error"]["message"]  # localhost is not the allowlisted 127.0.0.1:port
    status, err = await _raw(gw, "POST", path, {"url": f"https://localhost:{port}/mcp"})
    assert status == 400 and "non-public" in err["error"]["message"], err
    assert len(mcp.authorizations) == seen  # nothing reached the server
    status, err = await _raw(gw, "POST", path, {"url": "ftp://x"})
    assert status == 422 and err["error"]["param"] == "url"
    status, err = await _raw(gw, "POST", "/tenants/nope-nope/mcp-servers", {"url": mcp.url})
    assert status == 404
    status, added = await _raw(gw, "POST", path, {"url": mcp.url, "bearer": TOKEN})
    assert status == 201
    unlisted = {
        "type": "function",
        "function": {"name": "refund_order"},
        "source": {"mcp": added["id"]},
    }
    status, err = await _raw(
        gw, "PUT", f"/tenants/{t.id}/system-prompt", {"text": SYSTEM, "tools": [unlisted]}
    )
    assert status == 400 and err["error"]["param"] == "tools.0.function.name", err
    other = await gw.create_tenant("mcpother", system_prompt=SYSTEM)
    borrowed = {**unlisted, "function": {"name": "lookup_order"}}
    status, err = await _raw(
        gw, "PUT", f"/tenants/{other.id}/system-prompt", {"text": SYSTEM, "tools": [borrowed]}
    )
    assert status == 400 and err["error"]["param"] == "tools.0.source.mcp", err
