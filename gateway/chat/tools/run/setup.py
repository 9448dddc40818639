"""The gateway's tool runner, from settings (opened in ``cleanup_ctx``, closed with the app)."""

from __future__ import annotations

from opentelemetry.trace import Tracer
from prometheus_client import CollectorRegistry

from gateway.chat.tools.run.breaker import Breakers
from gateway.chat.tools.run.egress import Allowlist, Egress
from gateway.chat.tools.run.mcp import McpClient
from gateway.chat.tools.run.runner import ToolRunner
from gateway.settings import ToolSettings
from tenants.mcp_store import McpStore
from tenants.store import TenantStore
from tenants.tool_service import ToolStore


def make_tool_runner(
    settings: ToolSettings,
    store: TenantStore,
    tracer: Tracer,
    registry: CollectorRegistry,
) -> ToolRunner:
    allow = Allowlist.parse(settings.allowed_hosts)
    mcp = McpClient(allow, settings.max_response_bytes, settings.timeout_s, McpStore(store).access)
    egress = Egress(
        allow,
        timeout_s=settings.timeout_s,
        max_bytes=settings.max_response_bytes,
    )
    breakers = Breakers(settings.breaker_failures, settings.breaker_reset_s)
    return ToolRunner(egress, breakers, ToolStore(store).secret, tracer, registry, mcp)
