"""Admin routes of tenant tools (in the admin sub-app, behind its bearer auth)::

PUT  /v1/tenants/{id}/system-prompt        {text, tools?, tool_choice?, max_tool_rounds?}
                                           -> {version, webhook_secret?}   (tools: 400s;
                                           gateway/admin/prompts.py)
POST /v1/tenants/{id}/tool-secret/rotate   -> {webhook_secret}: a new signing secret, shown once
POST /v1/tenants/{id}/mcp-servers          {url, bearer?} -> 201 {id, url, tools, created_at}:
                                           the server's tools listed now (MCP tools/list) and
                                           kept as a snapshot; unreachable: 400
GET  /v1/tenants/{id}/mcp-servers          the tenant's servers (never a bearer token)

A version's tools are checked before the rest of the body (tenants/tools.py), so a malformed
tool is a 400 ``invalid_tools`` naming the field.
"""

from __future__ import annotations

from aiohttp import web

from gateway.admin.context import ADMIN_CONTEXT
from gateway.chat.tools.run.egress import EgressRefused
from gateway.chat.tools.run.mcp import McpUnreachable
from gateway.chat.tools.run.runner import TOOL_RUNNER
from gateway.errors import ApiError, register_error
from gateway.widget.body import read_json
from tenants.mcp_store import McpServerIn, McpServerList, McpStore
from tenants.schemas import ToolSecret, parse
from tenants.tool_service import ToolStore
from tenants.tools import InvalidTools


def register_tool_errors() -> None:
    register_error(InvalidTools, 400, "invalid_request_error", "invalid_tools")


async def rotate_tool_secret(request: web.Request) -> web.Response:
    ctx = request.app[ADMIN_CONTEXT]
    secret = await ToolStore(ctx.store).rotate_secret(request.match_info["id"], actor=ctx.actor)
    return web.json_response(ToolSecret(webhook_secret=secret).model_dump())


async def add_mcp_server(request: web.Request) -> web.Response:
    ctx = request.app[ADMIN_CONTEXT]
    data = parse(McpServerIn, await read_json(request))
    tenant = await ctx.store.get_tenant(request.match_info["id"])  # 404 before connecting
    runner = request.config_dict.get(TOOL_RUNNER)
    client = runner.mcp if runner is not None else None
    if client is None:
        raise ApiError(503, "MCP is not available", type_="service_unavailable")
    try:
        listed = await client.list_tools(data.url, data.bearer)
    except (McpUnreachable, EgressRefused) as exc:
        raise ApiError(400, str(exc), param="url", code="mcp_server_unreachable") from None
    tools = [t.body() for t in listed]
    out = await McpStore(ctx.store).add(tenant.id, data, tools, actor=ctx.actor)
    return web.json_response(out.model_dump(mode="json"), status=201)


async def list_mcp_servers(request: web.Request) -> web.Response:
    ctx = request.app[ADMIN_CONTEXT]
    servers = await McpStore(ctx.store).list(request.match_info["id"])
    return web.json_response(McpServerList(data=servers).model_dump(mode="json"))


def add_tool_admin_routes(app: web.Application) -> None:
    register_tool_errors()
    t = "/v1/tenants/{id}"
    app.router.add_routes(
        [
            web.post(f"{t}/tool-secret/rotate", rotate_tool_secret),
            web.post(f"{t}/mcp-servers", add_mcp_server),
            web.get(f"{t}/mcp-servers", list_mcp_servers),
        ]
    )
