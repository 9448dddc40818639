"""Circuit breakers of tenant tools count the endpoint failing, never the tool refusing a call.

Visitors choose a tool's arguments through the model: a tool that answers them 4xx, an MCP error
result or a JSON-RPC invalid-params error is working, and must stay on for everyone else. A
transport failure, a 5xx or no answer in time counts, for that tool alone (its siblings on the
same MCP server or webhook URL keep theirs). Against a real MCP server (the SDK's, on loopback)
and a real webhook receiver (aiohttp, on loopback).
"""

from __future__ import annotations

import asyncio
import json
from collections.abc import AsyncIterator, Callable

import pytest
from opentelemetry.trace import NoOpTracer
from prometheus_client import CollectorRegistry
from yarl import URL

from gateway.chat.tools.run.breaker import Breakers
from gateway.chat.tools.run.egress import Allowlist, Egress
from gateway.chat.tools.run.failures import Endpoint, ToolFailure
from gateway.chat.tools.run.mcp import McpClient
from gateway.chat.tools.run.runner import ToolRunner
from tenants.tools import TenantTool
from tests.gateway.chat.tools.tenant.mcp_server import TOKEN, McpTestServer, mcp_server
from tests.gateway.chat.tools.tenant.webhook_server import Receiver, webhook_receiver

SECRET = "s" * 64
SERVER_ID = "mcp_orders"
THRESHOLD = 2  # failures in a row that open a circuit


@pytest.fixture
async def receiver() -> AsyncIterator[Receiver]:
    async with webhook_receiver(SECRET) as r:
        yield r


@pytest.fixture
async def mcp() -> AsyncIterator[McpTestServer]:
    async with mcp_server() as server:
        yield server


def make_runner(
    allowed: str,
    mcp_url: str = "",
    *,
    timeout_s: float = 5.0,
    clock: Callable[[], float] | None = None,
) -> ToolRunner:
    async def secret(tenant_id: str) -> str | None:
        return SECRET

    async def servers(tenant_id: str, server_id: str) -> tuple[str, str | None] | None:
        return (mcp_url, TOKEN) if server_id == SERVER_ID else None

    allow = Allowlist.parse(allowed)
    egress = Egress(allow, timeout_s=timeout_s, max_bytes=64 << 10)
    breakers = Breakers(THRESHOLD, 60.0) if clock is None else Breakers(THRESHOLD, 60.0, clock)
    mcp = McpClient(allow, 64 << 10, timeout_s, servers)
    return ToolRunner(egress, breakers, secret, NoOpTracer(), CollectorRegistry(), mcp)


def hook(name: str, url: str) -> TenantTool:
    return TenantTool(name, None, None, webhook=url)


def mcp_tool(name: str) -> TenantTool:
    return TenantTool(name, None, None, mcp=SERVER_ID)


async def statuses(runner: ToolRunner, tool: TenantTool, arguments: str, n: int) -> list[str]:
    return [(await runner.run("acme", tool, f"c{i}", arguments, 5.0)).status for i in range(n)]


async def test_webhook_arguments_refused_never_open_the_circuit(receiver: Receiver) -> None:
    runner = make_runner(URL(receiver.url).authority)
    try:
        refused = hook("lookup", f"{receiver.url}/reject")
        runs = [await runner.run("acme", refused, f"c{i}", '{"id": "x"}', 5.0) for i in range(8)]
        assert [r.status for r in runs] == ["tool_error"] * 8
        assert json.loads(runs[-1].content) == {"error": "tool_error", "status": 422}
        assert receiver.paths() == ["/reject"] * 8  # every call reached the tool
    finally:
        await runner.egress.close()


async def test_a_failing_webhook_tool_opens_its_own_circuit_only(receiver: Receiver) -> None:
    runner = make_runner(URL(receiver.url).authority, timeout_s=0.5)
    try:
        # Two tools of one webhook URL: the failures of one leave the other's circuit closed.
        failing, sibling = (
            hook("lookup", f"{receiver.url}/fail"),
            hook("track", f"{receiver.url}/fail"),
        )
        assert await statuses(runner, failing, "{}", 4) == [
            "tool_error",
            "tool_error",
            "tool_unavailable",
            "tool_unavailable",
        ]
        assert await statuses(runner, sibling, "{}", 1) == ["tool_error"]
        assert receiver.paths() == ["/fail"] * 3
        # No answer in time counts as well.
        slow = hook("lookup", f"{receiver.url}/slow")
        assert await statuses(runner, slow, "{}", 3) == [
            "tool_timeout",
            "tool_timeout",
            "tool_unavailable",
        ]
    finally:
        await runner.egress.close()


async def test_mcp_arguments_refused_never_open_the_circuit(mcp: McpTestServer) -> None:
    runner = make_runner(URL(mcp.url).authority, mcp.url)
    try:
        lookup, cancel = mcp_tool("lookup_order"), mcp_tool("cancel_order")
        refusals = [
            (lookup, '{"order_id": "not a number"}', "validation error"),  # the SDK's isError
            (lookup, '{"order_id": 4711}', "no order 4711"),  # the tool's own isError
            (cancel, '{"order_id": 0}', "order_id must be 1 or more"),  # JSON-RPC invalid params
        ]
        for tool, arguments, message in refusals:
            for i in range(3 * THRESHOLD):
                run = await runner.run("acme", tool, f"c{i}", arguments, 5.0)
                assert run.status == "tool_error", run
                assert message in json.loads(run.content)["message"], run
        assert len(mcp.calls) == 3 * THRESHOLD * 2  # the SDK refused the wrong type itself
        ok = await runner.run("acme", lookup, "c", '{"order_id": 7}', 5.0)
        assert ok.status == "ok", ok
    finally:
        await runner.egress.close()


async def test_a_503_mcp_tool_opens_its_own_circuit_not_its_siblings(mcp: McpTestServer) -> None:
    runner = make_runner(URL(mcp.url).authority, mcp.url)
    try:
        mcp.unavailable.add("cancel_order")
        cancel, lookup = mcp_tool("cancel_order"), mcp_tool("lookup_order")
        runs = [await runner.run("acme", cancel, f"c{i}", '{"order_id": 5}', 5.0) for i in range(4)]
        assert [r.status for r in runs] == [
            "tool_error",
            "tool_error",
            "tool_unavailable",
            "tool_unavailable",
        ]
        assert json.loads(runs[0].content)["message"] == "HTTP 503"
        # The sibling on the same server still runs.
        assert await statuses(runner, lookup, '{"order_id": 7}', 3) == ["ok"] * 3
        assert [c["tool"] for c in mcp.calls] == ["lookup_order"] * 3
    finally:
        await runner.egress.close()


async def test_an_mcp_tool_that_hangs_is_a_timeout(mcp: McpTestServer) -> None:
    runner = make_runner(URL(mcp.url).authority, mcp.url, timeout_s=0.5)
    try:
        mcp.stalled.add("lookup_order")
        # The SDK's own request timeout (the call's deadline passed to it) is a timeout too, not
        # the JSON-RPC error the SDK raises for it.
        assert runner.mcp is not None
        with pytest.raises(ToolFailure) as failed:
            await runner.mcp.call("acme", SERVER_ID, "lookup_order", {"order_id": 7}, 0.5)
        assert (failed.value.code, failed.value.endpoint) == ("tool_timeout", Endpoint.DOWN)
        # Through the runner (its deadline around the call): a timeout, and a breaker failure.
        runs = [
            await runner.run("acme", mcp_tool("lookup_order"), f"c{i}", '{"order_id": 7}', 5.0)
            for i in range(3)
        ]
        assert [r.status for r in runs] == ["tool_timeout", "tool_timeout", "tool_unavailable"]
        assert json.loads(runs[0].content)["error"] == "tool_timeout"
        assert all(r.duration_s < 5.0 for r in runs[:2])  # the call's deadline, not the server's
    finally:
        await runner.egress.close()


async def test_a_cancelled_trial_leaves_the_circuit_half_open(mcp: McpTestServer) -> None:
    """A half-open circuit's one trial call, cancelled (its chat request's client left), must
    not keep the circuit from ever admitting another call."""
    now = [0.0]
    runner = make_runner(URL(mcp.url).authority, mcp.url, clock=lambda: now[0])
    cancel = mcp_tool("cancel_order")
    try:
        mcp.unavailable.add("cancel_order")
        assert await statuses(runner, cancel, '{"order_id": 5}', 3) == [
            "tool_error",
            "tool_error",
            "tool_unavailable",
        ]
        mcp.unavailable.clear()
        mcp.stalled.add("cancel_order")
        now[0] = 60.0  # half-open: one trial
        trial = asyncio.create_task(runner.run("acme", cancel, "t", '{"order_id": 5}', 5.0))
        await asyncio.sleep(0.3)
        assert not trial.done()
        trial.cancel()
        with pytest.raises(asyncio.CancelledError):
            await trial
        mcp.stalled.clear()
        assert await statuses(runner, cancel, '{"order_id": 5}', 1) == ["ok"]
    finally:
        await runner.egress.close()
