"""A real MCP server for the tool tests: the SDK's ``MCPServer`` (FastMCP in mcp 1.x) over
streamable HTTP on loopback (uvicorn), behind a bearer-token check.

Its tools refuse some arguments as real tools do: ``lookup_order`` with an error result
(``isError``) for an order it does not know, ``cancel_order`` with a JSON-RPC invalid-params error
for an order number below 1 (and the SDK refuses arguments of the wrong type with an error
result). Faults of the HTTP side, per tool: a tools/call of a tool in ``unavailable`` is answered
503 before it reaches the server, one of a tool in ``stalled`` is held until the server stops.
"""

from __future__ import annotations

import asyncio
import json
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from dataclasses import dataclass, field
from typing import Any

import uvicorn
from mcp import MCPError
from mcp.server.mcpserver import MCPServer
from mcp.server.mcpserver.exceptions import ToolError
from mcp.types import INVALID_PARAMS

TOKEN = "mcp-test-token-123"


@dataclass
class McpTestServer:
    url: str = ""
    calls: list[dict[str, Any]] = field(default_factory=list)
    authorizations: list[str] = field(default_factory=list)
    unavailable: set[str] = field(default_factory=set)  # tools whose calls get HTTP 503
    stalled: set[str] = field(default_factory=set)  # tools whose calls hang until the end
    released: asyncio.Event = field(default_factory=asyncio.Event)


def _server(record: McpTestServer) -> MCPServer:
    server = MCPServer("orders")

    @server.tool()
    def lookup_order(order_id: int) -> dict[str, Any]:
        """Look an order up by its number."""
        record.calls.append({"tool": "lookup_order", "order_id": order_id})
        if order_id > 1000:
            raise ToolError(f"no order {order_id}")
        return {"order_id": order_id, "status": "shipped", "carrier": "DHL"}

    @server.tool()
    def cancel_order(order_id: int) -> str:
        """Cancel an order."""
        record.calls.append({"tool": "cancel_order", "order_id": order_id})
        if order_id < 1:
            raise MCPError(INVALID_PARAMS, "order_id must be 1 or more")
        return f"order {order_id} cancelled"

    return server


def _bearer_only(app: Any, record: McpTestServer) -> Any:
    async def guarded(scope: Any, receive: Any, send: Any) -> None:
        if scope["type"] == "http":
            headers = dict(scope["headers"])
            auth = headers.get(b"authorization", b"").decode()
            record.authorizations.append(auth)
            if auth != f"Bearer {TOKEN}":
                await send({"type": "http.response.start", "status": 401, "headers": []})
                await send({"type": "http.response.body", "body": b""})
                return
        await app(scope, receive, send)

    return guarded


def _http_faults(app: Any, record: McpTestServer) -> Any:
    """503 or a hang for the tools/call requests of the tools ``record`` names."""

    async def faulty(scope: Any, receive: Any, send: Any) -> None:
        if scope["type"] != "http" or scope["method"] != "POST":
            await app(scope, receive, send)
            return
        messages = [await receive()]
        while messages[-1].get("more_body"):
            messages.append(await receive())
        tool = _called_tool(b"".join(m.get("body", b"") for m in messages))
        if tool in record.unavailable:
            await send({"type": "http.response.start", "status": 503, "headers": []})
            await send({"type": "http.response.body", "body": b"upstream unavailable"})
            return
        if tool in record.stalled:
            await record.released.wait()
        replay = iter(messages)

        async def replayed() -> Any:
            return next(replay, None) or await receive()

        await app(scope, replayed, send)

    return faulty


def _called_tool(body: bytes) -> str | None:
    try:
        message = json.loads(body)
    except ValueError:
        return None
    if isinstance(message, dict) and message.get("method") == "tools/call":
        return str(message.get("params", {}).get("name"))
    return None


@asynccontextmanager
async def mcp_server() -> AsyncIterator[McpTestServer]:
    record = McpTestServer()
    app = _bearer_only(_http_faults(_server(record).streamable_http_app(), record), record)
    config = uvicorn.Config(app, host="127.0.0.1", port=0, log_level="warning", lifespan="on")
    server = uvicorn.Server(config)
    task = asyncio.create_task(server.serve())
    try:
        while not server.started:
            assert not task.done(), "the MCP server did not start"
            await asyncio.sleep(0.01)
        port = server.servers[0].sockets[0].getsockname()[1]
        record.url = f"http://127.0.0.1:{port}/mcp"
        yield record
    finally:
        record.released.set()
        server.should_exit = True
        await task
