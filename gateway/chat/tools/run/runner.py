"""Runs one tenant tool call: webhook or MCP, bounded, observed, every failure an answer.

    outcome                   message                                 breaker (Endpoint)
    arguments not JSON        {"error": "invalid_arguments"}          -  (nothing is sent)
    circuit open              {"error": "tool_unavailable"}           -  (nothing is sent)
    refused by egress rules   {"error": "tool_endpoint_refused"}      -  (nothing is sent)
    no answer in time         {"error": "tool_timeout"}               failure
    no connection, 5xx        {"error": "tool_error", ...}            failure
    other status than 2xx     {"error": "tool_error", "status": N}    success: the tool answered
                              (3xx included: no redirect)
    MCP error result, JSON-   {"error": "tool_error", "message": ..}  success: the tool answered
    RPC error (bad params)
    answer over the cap       {"error": "tool_result_too_large"}      success
    answer not JSON           {"error": "tool_result_not_json"}       success
    otherwise                 the answer's JSON text                  success

Each tool has its own breaker (tenant, source, tool name): tools that share an MCP server or a
webhook URL fail alone, and only the endpoint failing counts, never the tool refusing arguments
a visitor chose (gateway/chat/tools/run/failures.py).

The text becomes the ``tool`` message the model reads next. Each call is one ``execute_tool``
span (GenAI semantic conventions), one ``tool_call`` log line (tenant, tool, status, duration;
never arguments or results) and one observation of ``kvgate_tool_call_seconds``.
"""

from __future__ import annotations

import asyncio
import json
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import Any

import aiohttp
import structlog
from aiohttp import web
from opentelemetry.trace import SpanKind, Tracer
from prometheus_client import CollectorRegistry, Histogram

from gateway.chat.tools.run.breaker import Breakers
from gateway.chat.tools.run.egress import Egress, EgressRefused, TooLarge
from gateway.chat.tools.run.failures import Endpoint, ToolFailure
from gateway.chat.tools.run.mcp import McpClient
from gateway.chat.tools.run.webhook import request_body, signed_headers
from tenants.tools import TenantTool

log = structlog.get_logger(__name__)

SecretLookup = Callable[[str], Awaitable[str | None]]
_BUCKETS = (0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0)


@dataclass(frozen=True)
class ToolRun:
    """One call and its outcome (``status``: ok or the error code of the table above)."""

    call_id: str
    name: str
    status: str
    content: str
    duration_s: float

    def body(self) -> dict[str, Any]:
        """The ``kvgate_tool_runs`` entry of the answer (never arguments or results)."""
        ms = round(self.duration_s * 1000, 1)
        return {"id": self.call_id, "name": self.name, "status": self.status, "duration_ms": ms}


class ToolRunner:
    def __init__(
        self,
        egress: Egress,
        breakers: Breakers,
        secret: SecretLookup,
        tracer: Tracer,
        registry: CollectorRegistry,
        mcp: McpClient | None = None,
    ) -> None:
        self.egress = egress
        self._breakers = breakers
        self._secret = secret
        self._tracer = tracer
        self.mcp = mcp  # also the admin API's, to list a server's tools
        self._seconds = Histogram(
            "kvgate_tool_call_seconds",
            "tenant tool calls run by the gateway, by tenant and outcome",
            ["tenant", "status"],
            buckets=_BUCKETS,
            registry=registry,
        )

    async def run(
        self, tenant_id: str, tool: TenantTool, call_id: str, arguments: str, timeout_s: float
    ) -> ToolRun:
        started = time.monotonic()
        attrs = {
            "gen_ai.operation.name": "execute_tool",
            "gen_ai.tool.name": tool.name,
            "gen_ai.tool.call.id": call_id,
            "gen_ai.tool.type": "function" if tool.webhook else "extension",
            "kvgate.tenant.id": tenant_id,
        }
        name = f"execute_tool {tool.name}"
        with self._tracer.start_as_current_span(name, kind=SpanKind.CLIENT, attributes=attrs) as sp:
            try:
                content, status = await self._call(tenant_id, tool, call_id, arguments, timeout_s)
            except ToolFailure as exc:
                content, status = exc.content(), exc.code
                sp.set_attribute("error.type", exc.code)
            duration = time.monotonic() - started
        self._seconds.labels(tenant_id, status).observe(duration)
        log.info(
            "tool_call",
            tenant=tenant_id,
            tool=tool.name,
            status=status,
            duration_ms=round(duration * 1000, 1),
        )
        return ToolRun(call_id, tool.name, status, content, duration)

    async def _call(
        self, tenant_id: str, tool: TenantTool, call_id: str, arguments: str, timeout_s: float
    ) -> tuple[str, str]:
        try:
            args = json.loads(arguments)
        except ValueError:
            raise ToolFailure("invalid_arguments") from None
        key = breaker_key(tenant_id, tool)
        if not self._breakers.admit(key):
            raise ToolFailure("tool_unavailable", message="the tool failed repeatedly")
        verdict: Endpoint | None = None  # None: cancelled, no verdict
        try:
            text = await self._send(tenant_id, tool, call_id, args, timeout_s)
            verdict = Endpoint.ANSWERED
        except ToolFailure as exc:
            verdict = exc.endpoint
            raise
        finally:
            if verdict is Endpoint.DOWN or verdict is Endpoint.ANSWERED:
                self._breakers.record(key, ok=verdict is Endpoint.ANSWERED)
            else:
                self._breakers.release(key)
        return text, "ok"

    async def _send(
        self, tenant_id: str, tool: TenantTool, call_id: str, args: Any, timeout_s: float
    ) -> str:
        limit = min(timeout_s, self.egress.timeout_s)
        try:
            if tool.mcp is not None:
                return await self._mcp(tenant_id, tool.mcp, tool.name, args, limit)
            return await self._webhook(tenant_id, tool, call_id, args, limit)
        except TimeoutError:
            raise ToolFailure("tool_timeout", endpoint=Endpoint.DOWN, timeout_s=limit) from None
        except EgressRefused as exc:
            raise ToolFailure("tool_endpoint_refused", message=str(exc)) from None
        except TooLarge:
            raise ToolFailure(
                "tool_result_too_large",
                endpoint=Endpoint.ANSWERED,
                limit_bytes=self.egress.max_bytes,
            ) from None
        except (aiohttp.ClientError, OSError) as exc:
            name = type(exc).__name__
            raise ToolFailure("tool_error", endpoint=Endpoint.DOWN, message=name) from None

    async def _mcp(self, tenant_id: str, server_id: str, name: str, args: Any, limit: float) -> str:
        if self.mcp is None:
            raise ToolFailure("tool_unavailable", message="MCP is not enabled")
        deadline = asyncio.timeout(limit)
        try:
            async with deadline:
                return await self.mcp.call(tenant_id, server_id, name, args, limit)
        except ToolFailure:
            # The SDK's task groups may answer the deadline's cancellation with an error of
            # their own, which asyncio.timeout then lets through as it is: still a timeout.
            if deadline.expired():
                raise TimeoutError from None
            raise

    async def _webhook(
        self, tenant_id: str, tool: TenantTool, call_id: str, args: Any, limit: float
    ) -> str:
        assert tool.webhook is not None
        try:
            secret = await self._secret(tenant_id)
        except Exception:  # the tenant database is away: the call fails, the turn goes on
            raise ToolFailure(
                "tool_unavailable", message="the signing secret is unavailable"
            ) from None
        if secret is None:
            raise ToolFailure("tool_unavailable", message="the tenant has no signing secret")
        body = request_body(tool.name, call_id, args)
        headers = signed_headers(secret, tenant_id, tool.name, call_id, body)
        reply = await self.egress.post(tool.webhook, body, headers, limit)
        if not 200 <= reply.status < 300:
            health = Endpoint.DOWN if reply.status >= 500 else Endpoint.ANSWERED
            raise ToolFailure("tool_error", endpoint=health, status=reply.status)
        return json_text(reply.body)


def breaker_key(tenant_id: str, tool: TenantTool) -> str:
    """One circuit per tool of a tenant's source (a webhook URL, an MCP server)."""
    return f"{tenant_id}\x00{tool.webhook or tool.mcp}\x00{tool.name}"


def json_text(raw: bytes) -> str:
    """The answer as JSON text, or ``tool_result_not_json``."""
    try:
        text = raw.decode("utf-8")
        json.loads(text)
    except ValueError:
        raise ToolFailure("tool_result_not_json", endpoint=Endpoint.ANSWERED) from None
    return text.strip()


# The gateway's runner of tenant tools while the app runs (set in gateway/app.py's cleanup_ctx):
# the tool loop and the admin API's MCP listing read it.
TOOL_RUNNER = web.AppKey("tool_runner", ToolRunner)
