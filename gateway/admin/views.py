"""Admin API views: parse and validate, call the store, serialize. No logic of their own.

Pagination (GET /v1/tenants, GET /v1/audit): ``?limit=`` (1..200, default 50) and ``?cursor=``
(the ``next_cursor`` of the previous page); responses are ``{"data": [...], "next_cursor": ...}``
with ``next_cursor`` null on the last page. GET /v1/tenants takes ``?status=`` (active,
suspended, deleted or all; default: every status but deleted).
"""

from __future__ import annotations

import inspect
import json
from typing import Any

from aiohttp import web
from pydantic import BaseModel

from gateway.admin.context import ADMIN_CONTEXT, AdminContext
from gateway.admin.prompts import check_prompt, put_version
from gateway.errors import ApiError
from tenants.errors import InvalidField
from tenants.schemas import (
    MAX_LIMIT,
    KeyCreate,
    KeyLimitsIn,
    KeyList,
    KeyPriorityIn,
    LimitsIn,
    PromptList,
    TenantCreate,
    TenantPatch,
    parse,
)


def _ctx(request: web.Request) -> AdminContext:
    return request.app[ADMIN_CONTEXT]


def _json(model: BaseModel | dict[str, Any], status: int = 200) -> web.Response:
    body = model.model_dump(mode="json") if isinstance(model, BaseModel) else model
    return web.json_response(body, status=status)


async def _body(request: web.Request) -> Any:
    """The JSON body. Malformed or empty JSON raises JSONDecodeError (400 from the error
    middleware); bytes that are not text in the declared charset, numbers Python refuses to
    convert and nesting deeper than the decoder's recursion limit are 400s here."""
    raw = await request.read()
    charset = request.charset or "utf-8"
    try:
        return json.loads(raw.decode(charset))
    except json.JSONDecodeError:
        raise
    except LookupError:
        raise ApiError(400, f"unsupported charset {charset!r}") from None
    except UnicodeDecodeError:
        raise ApiError(400, f"request body is not valid JSON: not {charset} text") from None
    except ValueError:  # an integer with more digits than int() converts
        raise ApiError(400, "request body is not valid JSON: a number is too long") from None
    except RecursionError:
        raise ApiError(400, "request body is not valid JSON: nested too deeply") from None


def _limit(request: web.Request) -> int:
    raw = request.query.get("limit", "50")
    try:
        return int(raw)
    except ValueError:
        raise InvalidField("limit must be an integer", param="limit") from None


def _version(request: web.Request) -> int:
    """The ``{version}`` path segment: a prompt version is an integer in 1..2**31-1."""
    raw = request.match_info["version"]
    value = int(raw) if raw.isascii() and raw.isdigit() and len(raw) <= 10 else 0
    if not 1 <= value <= MAX_LIMIT:
        raise InvalidField(f"version must be an integer from 1 to {MAX_LIMIT}", param="version")
    return value


async def create_tenant(request: web.Request) -> web.Response:
    data = parse(TenantCreate, await _body(request))
    if data.system_prompt is not None:
        await check_prompt(request, data.id, data.system_prompt, "system_prompt")
    ctx = _ctx(request)
    return _json(await ctx.store.create_tenant(data, actor=ctx.actor), status=201)


async def list_tenants(request: web.Request) -> web.Response:
    q = request.query
    page = await _ctx(request).store.list_tenants(
        limit=_limit(request), cursor=q.get("cursor"), status=q.get("status")
    )
    return _json(page)


async def get_tenant(request: web.Request) -> web.Response:
    return _json(await _ctx(request).store.get_tenant(request.match_info["id"]))


async def patch_tenant(request: web.Request) -> web.Response:
    patch = parse(TenantPatch, await _body(request))
    ctx = _ctx(request)
    return _json(await ctx.store.update_tenant(request.match_info["id"], patch, actor=ctx.actor))


async def delete_tenant(request: web.Request) -> web.Response:
    ctx = _ctx(request)
    return _json(await ctx.store.delete_tenant(request.match_info["id"], actor=ctx.actor))


async def set_prompt(request: web.Request) -> web.Response:
    """A new version: text and tools together, omitted ones carried (gateway/admin/prompts.py)."""
    return await put_version(request, await _body(request))


async def list_prompts(request: web.Request) -> web.Response:
    prompts = await _ctx(request).store.list_prompts(request.match_info["id"])
    return _json(PromptList(data=prompts))


async def get_prompt(request: web.Request) -> web.Response:
    store = _ctx(request).store
    return _json(await store.get_prompt(request.match_info["id"], _version(request)))


async def activate_prompt(request: web.Request) -> web.Response:
    """Rollback or roll forward to an existing version (no body)."""
    ctx = _ctx(request)
    tenant_id, version = request.match_info["id"], _version(request)
    return _json(await ctx.store.activate_prompt(tenant_id, version, actor=ctx.actor))


async def list_keys(request: web.Request) -> web.Response:
    keys = await _ctx(request).store.list_keys(request.match_info["id"])
    return _json(KeyList(data=keys))


async def set_key_limits(request: web.Request) -> web.Response:
    limits = parse(KeyLimitsIn, await _body(request))
    ctx = _ctx(request)
    tenant_id, key_id = request.match_info["id"], request.match_info["key_id"]
    return _json(await ctx.store.set_key_limits(tenant_id, key_id, limits, actor=ctx.actor))


async def create_key(request: web.Request) -> web.Response:
    data = parse(KeyCreate, await _body(request))
    ctx = _ctx(request)
    created = await ctx.store.create_key(request.match_info["id"], data, actor=ctx.actor)
    return _json(created, status=201)


async def revoke_key(request: web.Request) -> web.Response:
    ctx = _ctx(request)
    tenant_id, key_id = request.match_info["id"], request.match_info["key_id"]
    return _json(await ctx.store.revoke_key(tenant_id, key_id, actor=ctx.actor))


async def set_key_priority(request: web.Request) -> web.Response:
    data = parse(KeyPriorityIn, await _body(request))
    ctx = _ctx(request)
    tenant_id, key_id = request.match_info["id"], request.match_info["key_id"]
    return _json(await ctx.store.set_key_priority(tenant_id, key_id, data, actor=ctx.actor))


async def set_limits(request: web.Request) -> web.Response:
    limits = parse(LimitsIn, await _body(request))
    ctx = _ctx(request)
    return _json(await ctx.store.set_limits(request.match_info["id"], limits, actor=ctx.actor))


async def get_cache(request: web.Request) -> web.Response:
    ctx = _ctx(request)
    tenant = await ctx.store.get_tenant(request.match_info["id"])  # 404 for unknown tenants
    if ctx.cache_provider is None:
        raise ApiError(
            503,
            "cache statistics are not available",
            type_="service_unavailable",
            code="cache_stats_unavailable",
        )
    stats = ctx.cache_provider(tenant.id)
    if inspect.isawaitable(stats):
        stats = await stats
    return _json({"tenant_id": tenant.id, **dict(stats)})


async def list_audit(request: web.Request) -> web.Response:
    q = request.query
    page = await _ctx(request).store.list_audit(
        tenant_id=q.get("tenant"), limit=_limit(request), cursor=q.get("cursor")
    )
    return _json(page)


async def tenant_audit(request: web.Request) -> web.Response:
    """One tenant's audit rows (what its own admins may read)."""
    store = _ctx(request).store
    tenant = await store.get_tenant(request.match_info["id"])  # 404 for unknown tenants
    page = await store.list_audit(
        tenant_id=tenant.id, limit=_limit(request), cursor=request.query.get("cursor")
    )
    return _json(page)


def add_routes(app: web.Application) -> None:
    t = "/v1/tenants/{id}"
    app.router.add_routes(
        [
            web.post("/v1/tenants", create_tenant),
            web.get("/v1/tenants", list_tenants),
            web.get(t, get_tenant),
            web.patch(t, patch_tenant),
            web.delete(t, delete_tenant),
            web.put(f"{t}/system-prompt", set_prompt),
            web.get(f"{t}/system-prompts", list_prompts),
            web.get(f"{t}/system-prompts/{{version}}", get_prompt),
            web.post(f"{t}/system-prompts/{{version}}/activate", activate_prompt),
            web.post(f"{t}/keys", create_key),
            web.get(f"{t}/keys", list_keys),
            web.delete(f"{t}/keys/{{key_id}}", revoke_key),
            web.put(f"{t}/keys/{{key_id}}/limits", set_key_limits),
            web.put(f"{t}/keys/{{key_id}}/priority", set_key_priority),
            web.put(f"{t}/limits", set_limits),
            web.get(f"{t}/cache", get_cache),
            web.get(f"{t}/audit", tenant_audit),
            web.get("/v1/audit", list_audit),
        ]
    )
