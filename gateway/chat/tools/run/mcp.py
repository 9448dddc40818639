"""MCP servers of a tenant through the official SDK (``mcp``): list tools when a server is
added, ``tools/call`` when the model calls one (streamable HTTP, gateway/chat/tools/run/mcp_http.py
for the egress rules; one connection per call: nothing of one call outlives it).

A call's answer becomes the ``tool`` message: the structured content when the tool returned
some, else its text parts (as they are when they are JSON, else ``{"content": text}``). A call
that failed, and what it says of the server (``Endpoint``, what the tool's breaker counts)::

    the tool's error result (isError)          tool_error              ANSWERED
    a JSON-RPC error (invalid params, unknown  tool_error              ANSWERED
    tool, the server's own internal error)
    a 4xx of the server's HTTP endpoint        tool_error              ANSWERED
    no answer within the call's deadline       tool_timeout            DOWN
    (the SDK's request timeout included)
    no connection, a broken one, an HTTP 5xx   tool_error              DOWN
    anything else the SDK raises               tool_error              DOWN

A 5xx and a broken connection reach the SDK's caller as JSON-RPC errors it makes up
(``INTERNAL_ERROR``, ``CONNECTION_CLOSED``): the HTTP side is read from the transport
(``Health``), never guessed from the error code.
"""

from __future__ import annotations

import json
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import Any

import httpx2
from mcp import Client, MCPError
from mcp.client.streamable_http import streamable_http_client
from mcp.types import CONNECTION_CLOSED, REQUEST_TIMEOUT

from gateway.chat.tools.run.egress import Allowlist, EgressRefused, TooLarge
from gateway.chat.tools.run.failures import Endpoint, ToolFailure
from gateway.chat.tools.run.mcp_http import Health, mcp_http_client

LIST_BYTES = 1 << 20  # a server's tool listing may be larger than one tool answer
# (tenant id, server id) -> (url, bearer) of the tenant's own server, or None
ServerLookup = Callable[[str, str], Awaitable[tuple[str, str | None] | None]]


@dataclass(frozen=True)
class ListedTool:
    name: str
    description: str | None
    input_schema: dict[str, Any]

    def body(self) -> dict[str, Any]:
        return {
            "name": self.name,
            "description": self.description,
            "input_schema": self.input_schema,
        }


class McpUnreachable(Exception):
    """The server could not be listed (its message says why; never the bearer)."""


class McpClient:
    def __init__(
        self, allow: Allowlist, max_bytes: int, timeout_s: float, servers: ServerLookup
    ) -> None:
        self._allow = allow
        self._max_bytes = max_bytes
        self._timeout_s = timeout_s
        self._servers = servers

    def _client(
        self, url: str, bearer: str | None, cap: int, timeout_s: float, health: Health
    ) -> Client:
        http = mcp_http_client(url, bearer, self._allow, cap, timeout_s, health)
        transport = streamable_http_client(url, http_client=http)
        return Client(transport, read_timeout_seconds=timeout_s, cache=None)

    async def list_tools(self, url: str, bearer: str | None) -> list[ListedTool]:
        try:
            async with self._client(url, bearer, LIST_BYTES, self._timeout_s, Health()) as c:
                listed = await c.list_tools()
        except Exception as exc:
            raise McpUnreachable(_reason(exc)) from None
        return [ListedTool(t.name, t.description, dict(t.input_schema)) for t in listed.tools]

    async def call(
        self, tenant_id: str, server_id: str, name: str, args: Any, timeout_s: float
    ) -> str:
        try:
            found = await self._servers(tenant_id, server_id)
        except Exception:  # the tenant database is away: the call fails, the turn goes on
            raise ToolFailure("tool_unavailable", message="the MCP server is unavailable") from None
        if found is None:
            raise ToolFailure("tool_unavailable", message="the MCP server is gone")
        url, bearer = found
        health = Health()
        try:
            async with self._client(url, bearer, self._max_bytes, timeout_s, health) as c:
                result = await c.call_tool(name, args, read_timeout_seconds=timeout_s)
        except Exception as exc:
            raise _failure(exc, health) from None
        if result.is_error:
            message = _text(result.content)[:200]
            raise ToolFailure("tool_error", endpoint=Endpoint.ANSWERED, message=message)
        if result.structured_content is not None:
            return json.dumps(result.structured_content, ensure_ascii=False)
        text = _text(result.content)
        try:
            json.loads(text)
        except ValueError:
            return json.dumps({"content": text}, ensure_ascii=False)
        return text.strip()


def _text(content: list[Any]) -> str:
    return "".join(getattr(part, "text", "") for part in content)


def _causes(exc: BaseException) -> list[BaseException]:
    """``exc``, what it groups (the SDK runs on task groups) and what caused it."""
    out, todo = [], [exc]
    while todo:
        e = todo.pop()
        out.append(e)
        if isinstance(e, BaseExceptionGroup):
            todo.extend(e.exceptions)
        if e.__cause__ is not None:
            todo.append(e.__cause__)
        elif e.__context__ is not None and not e.__suppress_context__:
            todo.append(e.__context__)
    return out


def _failure(exc: BaseException, health: Health) -> ToolFailure:
    """The failure of a call the SDK raised ``exc`` for (the module docstring's table)."""
    causes = _causes(exc)
    for e in causes:
        if isinstance(e, ToolFailure):
            return e
        if isinstance(e, EgressRefused):
            return ToolFailure("tool_endpoint_refused", message=str(e))
        if isinstance(e, TooLarge):
            return ToolFailure("tool_result_too_large", endpoint=Endpoint.ANSWERED)
    if any(_timed_out(e) for e in causes):
        return ToolFailure("tool_timeout", endpoint=Endpoint.DOWN)
    if health.failure is not None:
        return ToolFailure("tool_error", endpoint=Endpoint.DOWN, message=health.failure)
    for e in causes:
        if isinstance(e, MCPError) and e.code != CONNECTION_CLOSED:
            return ToolFailure("tool_error", endpoint=Endpoint.ANSWERED, message=e.message[:200])
    return ToolFailure("tool_error", endpoint=Endpoint.DOWN, message=type(exc).__name__)


def _timed_out(e: BaseException) -> bool:
    if isinstance(e, MCPError):
        return e.code == REQUEST_TIMEOUT
    return isinstance(e, TimeoutError | httpx2.TimeoutException)


def _reason(exc: BaseException) -> str:
    for e in _causes(exc):
        if isinstance(e, EgressRefused | TooLarge):
            return str(e)
    return f"the MCP server did not answer a tool listing ({type(exc).__name__})"
