"""MCP servers of a tenant through the official SDK (``mcp``): list tools when a server is
added, ``tools/call`` when the model calls one (streamable HTTP, gateway/tools_exec/mcp_http.py
for the egress rules; one connection per call: nothing of one call outlives it).

A call's answer becomes the ``tool`` message: the structured content when the tool returned
some, else its text parts (as they are when they are JSON, else ``{"content": text}``); an error
result is ``tool_error``.
"""

from __future__ import annotations

import json
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import Any

from mcp import Client
from mcp.client.streamable_http import streamable_http_client

from gateway.tools_exec.egress import Allowlist, EgressRefused, TooLarge
from gateway.tools_exec.failures import ToolFailure
from gateway.tools_exec.mcp_http import mcp_http_client

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

    def _client(self, url: str, bearer: str | None, cap: int, timeout_s: float) -> Client:
        http = mcp_http_client(url, bearer, self._allow, cap, timeout_s)
        transport = streamable_http_client(url, http_client=http)
        return Client(transport, read_timeout_seconds=timeout_s, cache=None)

    async def list_tools(self, url: str, bearer: str | None) -> list[ListedTool]:
        try:
            async with self._client(url, bearer, LIST_BYTES, self._timeout_s) as c:
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
        try:
            async with self._client(url, bearer, self._max_bytes, timeout_s) as c:
                result = await c.call_tool(name, args, read_timeout_seconds=timeout_s)
        except Exception as exc:
            raise _failure(exc) from None
        if result.is_error:
            raise ToolFailure("tool_error", message=_text(result.content)[:200])
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


def _failure(exc: BaseException) -> ToolFailure:
    for e in _causes(exc):
        if isinstance(e, ToolFailure):
            return e
        if isinstance(e, EgressRefused):
            return ToolFailure("tool_endpoint_refused", message=str(e))
        if isinstance(e, TooLarge):
            return ToolFailure("tool_result_too_large")
        if isinstance(e, TimeoutError):
            return ToolFailure("tool_timeout")
    return ToolFailure("tool_error", message=type(exc).__name__)


def _reason(exc: BaseException) -> str:
    for e in _causes(exc):
        if isinstance(e, EgressRefused | TooLarge):
            return str(e)
    return f"the MCP server did not answer a tool listing ({type(exc).__name__})"
