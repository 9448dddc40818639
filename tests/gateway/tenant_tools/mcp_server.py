"""A real MCP server for the tool tests: the SDK's ``MCPServer`` (FastMCP in mcp 1.x) over
streamable HTTP on loopback (uvicorn), behind a bearer-token check."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from dataclasses import dataclass, field
from typing import Any

import uvicorn
from mcp.server.mcpserver import MCPServer

TOKEN = "mcp-test-token-123"


@dataclass
class McpTestServer:
    url: str = ""
    calls: list[dict[str, Any]] = field(default_factory=list)
    authorizations: list[str] = field(default_factory=list)


def _server(record: McpTestServer) -> MCPServer:
    server = MCPServer("orders")

    @server.tool()
    def lookup_order(order_id: int) -> dict[str, Any]:
        """Look an order up by its number."""
        record.calls.append({"tool": "lookup_order", "order_id": order_id})
        return {"order_id": order_id, "status": "shipped", "carrier": "DHL"}

    @server.tool()
    def cancel_order(order_id: int) -> str:
        """Cancel an order."""
        record.calls.append({"tool": "cancel_order", "order_id": order_id})
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


@asynccontextmanager
async def mcp_server() -> AsyncIterator[McpTestServer]:
    record = McpTestServer()
    app = _bearer_only(_server(record).streamable_http_app(), record)
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
        server.should_exit = True
        await task
