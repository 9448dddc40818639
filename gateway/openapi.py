"""The OpenAPI 3.1 document of the gateway, served at ``GET /openapi.json`` (public, no auth).

Schemas are generated from the pydantic models the views validate with (tenants/schemas.py,
gateway/chat/schemas.py) and the answer models of gateway/api_models.py; only the list of
operations below is written by hand. ``tests/gateway/test_openapi.py`` checks that it names
every route the app serves, and the schemathesis suite checks every answer against it.
"""

from __future__ import annotations

import json
import re
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from aiohttp import web
from pydantic import BaseModel
from pydantic.json_schema import models_json_schema

from gateway import api_models as am
from gateway.chat.response_models import ChatCompletion, ChatCompletionChunk
from gateway.chat.schemas import ChatRequest
from gateway.errors import Handler
from gateway.widget.views import SessionIn
from tenants import schemas as ts

REF = "#/components/schemas/{model}"
TENANT_KEY = "tenantKey"
ADMIN_TOKEN = "adminToken"
JSON = "application/json"
SSE = "text/event-stream"
ADMIN = "/admin/v1"

_ERRORS = {
    400: "malformed request (not JSON, wrong types, unknown or unsupported parameters)",
    401: "missing or invalid bearer token",
    403: "tenant suspended, or a widget key used from an origin it is not bound to",
    404: "no such resource",
    409: "conflicts with the current state (exists already, tenant deleted)",
    413: "request body larger than KVGATE_MAX_BODY_BYTES",
    422: "a field failed validation (error.param names it)",
    429: "a rate limit is exhausted (Retry-After and x-ratelimit-* headers say until when)",
    503: "a dependency is unavailable (database, rate limiter, engine) or shutting down",
}


@dataclass(frozen=True)
class Query:
    name: str
    schema: Mapping[str, Any]
    description: str


@dataclass(frozen=True)
class Operation:
    """One route. ``ok``: success status -> answer model (None: no JSON answer)."""

    method: str
    path: str
    op_id: str
    summary: str
    tag: str
    security: str | None
    ok: Mapping[int, type[BaseModel] | None]
    errors: tuple[int, ...] = ()
    body: type[BaseModel] | None = None
    query: tuple[Query, ...] = ()
    stream: bool = False  # the 200 may also be an SSE stream of ChatCompletionChunk
    media: str | None = None  # the success content type when it is not a model's JSON
    links: Mapping[str, Mapping[str, str]] = field(default_factory=dict)  # op_id -> params


_PAGE = (
    Query("limit", {"type": "integer", "minimum": 1, "maximum": 200}, "page size (default 50)"),
    Query("cursor", {"type": "string"}, "next_cursor of the previous page"),
)
_BODY_ERRORS = (400, 413, 422)
_ADMIN_ERRORS = (401, 503)
_T = f"{ADMIN}/tenants/{{id}}"
_TENANT_LINK = {"id": "$response.body#/id"}
_SAME_TENANT = {"id": "$request.path.id"}


def _admin(
    method: str, path: str, op_id: str, summary: str, ok: Mapping[int, Any], *errors: int, **kw: Any
) -> Operation:
    errs = (*_ADMIN_ERRORS, *errors, *(_BODY_ERRORS if "body" in kw else ()))
    return Operation(method, path, op_id, summary, "admin", ADMIN_TOKEN, ok, errs, **kw)


def _links(params: Mapping[str, str], *op_ids: str) -> dict[str, Mapping[str, str]]:
    """OpenAPI links from a success answer to ``op_ids``, each given the same ``params``."""
    return {op_id: params for op_id in op_ids}


OPERATIONS: tuple[Operation, ...] = (
    Operation(
        "post",
        "/v1/chat/completions",
        "createChatCompletion",
        "OpenAI chat completion (JSON, or an SSE stream with stream=true)",
        "chat",
        TENANT_KEY,
        {200: ChatCompletion},
        (400, 401, 403, 404, 413, 429, 503),
        body=ChatRequest,
        stream=True,
    ),
    Operation(
        "get", "/v1/models", "listModels", "the served model", "chat", TENANT_KEY,
        {200: am.ModelList}, (401, 403, 503),
    ),
    Operation("get", "/healthz", "health", "liveness", "ops", None, {200: am.Health}),
    Operation(
        "get", "/readyz", "ready", "readiness (503 while a check fails)", "ops", None,
        {200: am.Readiness, 503: am.Readiness},
    ),
    Operation(
        "get", "/openapi.json", "openapi", "this document", "ops", None, {200: None}, media=JSON
    ),
    Operation(
        "get", "/widget/v1/kvgate-chat.js", "widgetScript",
        "the embeddable chat widget (ETag; 304 for If-None-Match)", "widget", None,
        {200: None, 304: None}, media="application/javascript",
    ),
    Operation(
        "get", "/widget/v1/config", "widgetConfig",
        "what a widget key's page shows (the key in ?key=, checked against Origin)", "widget",
        None, {200: am.WidgetConfig}, (401, 403, 503),
        query=(Query("key", {"type": "string"}, "a widget key"),),
    ),
    Operation(
        "post", "/v1/widget/sessions", "createWidgetSession",
        "a signed session token for one end user on one origin (server keys only)", "widget",
        TENANT_KEY, {201: am.WidgetSession}, (400, 401, 403, 413, 422, 503), body=SessionIn,
    ),
    _admin(
        "post", f"{ADMIN}/tenants", "createTenant", "create a tenant", {201: ts.TenantOut}, 409,
        body=ts.TenantCreate,
        links=_links(
            _TENANT_LINK,
            "getTenant", "patchTenant", "deleteTenant", "setSystemPrompt", "listPrompts",
            "createKey", "listKeys", "setLimits", "getCache", "getWidget", "setWidget",
            "rotateWidgetSecret",
        ),
    ),
    _admin(
        "get", f"{ADMIN}/tenants", "listTenants", "list tenants (paginated)",
        {200: ts.TenantPage}, 422,
        query=(
            *_PAGE,
            Query(
                "status",
                {"type": "string", "enum": ["active", "suspended", "deleted", "all"]},
                "default: every status but deleted",
            ),
        ),
    ),
    _admin("get", _T, "getTenant", "one tenant with its keys", {200: ts.TenantOut}, 404, 422),
    _admin(
        "patch", _T, "patchTenant", "rename, suspend, resume or restore",
        {200: ts.TenantOut}, 404, 409, body=ts.TenantPatch,
    ),
    _admin(
        "delete", _T, "deleteTenant", "soft delete (idempotent)", {200: ts.TenantOut}, 404, 422
    ),
    _admin(
        "put", f"{_T}/system-prompt", "setSystemPrompt", "add a prompt version, made active",
        {200: ts.PromptVersion}, 404, 409, body=ts.PromptSet,
        links=_links(
            {**_SAME_TENANT, "version": "$response.body#/version"}, "getPrompt", "activatePrompt"
        ),
    ),
    _admin(
        "get", f"{_T}/system-prompts", "listPrompts", "prompt versions, newest first",
        {200: ts.PromptList}, 404, 422,
    ),
    _admin(
        "get", f"{_T}/system-prompts/{{version}}", "getPrompt", "one prompt version",
        {200: ts.PromptOut}, 404, 422,
    ),
    _admin(
        "post", f"{_T}/system-prompts/{{version}}/activate", "activatePrompt",
        "make an existing version active (rollback or roll forward): pinned before traffic "
        "switches, the old version unpinned when its requests end",
        {200: ts.PromptActivated}, 404, 409, 422,
    ),
    _admin(
        "post", f"{_T}/keys", "createKey", "create an API key (the key is returned only here)",
        {201: ts.KeyCreated}, 404, 409, body=ts.KeyCreate,
        links=_links({**_SAME_TENANT, "key_id": "$response.body#/id"}, "revokeKey", "setKeyLimits"),
    ),
    _admin(
        "get", f"{_T}/keys", "listKeys", "a tenant's keys with their limits (never the keys)",
        {200: ts.KeyList}, 404, 422,
    ),
    _admin(
        "delete", f"{_T}/keys/{{key_id}}", "revokeKey", "revoke a key (idempotent)",
        {200: ts.KeyOut}, 404, 422,
    ),
    _admin(
        "put", f"{_T}/keys/{{key_id}}/limits", "setKeyLimits",
        "replace a key's own limits (null: only the tenant's apply)",
        {200: ts.KeyOut}, 404, 409, body=ts.KeyLimitsIn,
    ),
    _admin(
        "put", f"{_T}/limits", "setLimits", "replace the tenant's limits (null: the default)",
        {200: ts.TenantOut}, 404, 409, body=ts.LimitsIn,
    ),
    _admin(
        "get", f"{_T}/cache", "getCache", "pin state and prefix-cache counters",
        {200: am.CacheInfo}, 404, 422,
    ),
    _admin(
        "get", f"{_T}/widget", "getWidget", "the widget settings (the secret only as a flag)",
        {200: ts.WidgetSettingsOut}, 404, 422,
    ),
    _admin(
        "put", f"{_T}/widget", "setWidget", "replace the widget settings",
        {200: ts.WidgetSettingsOut}, 404, 409, body=ts.WidgetSettingsIn,
    ),
    _admin(
        "post", f"{_T}/widget/rotate-secret", "rotateWidgetSecret",
        "new session secret: every session token issued so far is revoked",
        {200: ts.WidgetSettingsOut}, 404, 409, 422,
    ),
    _admin(
        "get", f"{ADMIN}/cluster", "getCluster", "workers, health, load and prompt placement",
        {200: am.ClusterReport},
    ),
    _admin(
        "get", f"{ADMIN}/audit", "listAudit", "audit log, newest first (never secrets)",
        {200: ts.AuditPage}, 422,
        query=(*_PAGE, Query("tenant", {"type": "string"}, "only this tenant's rows")),
    ),
)  # fmt: skip

WIDGET_DEMO = Operation(
    "get", "/widget/demo", "widgetDemo", "demo page with the widget (embedded default only)",
    "widget", None, {200: None}, (503,), media="text/html",
)  # fmt: skip

# Every error answer names the request (quote it in a support ticket); a 429 says when to retry.
_REQUEST_ID = {
    "x-request-id": {
        "required": True,
        "schema": {"type": "string", "minLength": 1},
        "description": "the request's id, also in the gateway's log line",
    }
}
_RETRY_AFTER = {
    "Retry-After": {
        "required": True,
        "schema": {"type": "string", "pattern": "^[0-9]+$"},
        "description": "seconds until the exhausted limit admits the request",
    }
}
_RATE_HEADERS = {
    f"x-ratelimit-{what}-{dim}": {
        "required": False,
        "schema": {"type": "string"},
        "description": f"{what} of the most restrictive {dim} limit (x-ratelimit-scope)",
    }
    for what in ("limit", "remaining", "reset")
    for dim in ("requests", "tokens")
} | {
    "x-ratelimit-scope": {
        "required": False,
        "schema": {"type": "string"},
        "description": "whose limit the x-ratelimit-* values are: tenant, key or visitor",
    }
}

_PATH_PARAMS: dict[str, dict[str, Any]] = {
    "id": {"type": "string", "description": "tenant id"},
    "version": {"type": "integer", "minimum": 1, "maximum": ts.MAX_LIMIT},
    "key_id": {"type": "string", "description": "key id (from createKey or listKeys)"},
}


def _json_content(name: str) -> dict[str, Any]:
    return {JSON: {"schema": {"$ref": REF.format(model=name)}}}


# OpenAPI 3.1 (before 3.2's itemSchema): the schema of an event-stream body describes one event.
_SSE_EVENT: dict[str, Any] = {
    "type": "object",
    "properties": {
        "event": {"type": "string"},
        "data": {
            "type": "string",
            "description": "a ChatCompletionChunk as JSON, an error object "
            '(`{"error": {...}}`) when the stream fails after it started, or `[DONE]`',
        },
        "id": {"type": "string"},
        "retry": {"type": "integer"},
    },
    "required": ["data"],
}
_SSE_DESCRIPTION = (
    "with stream=true: `data: {ChatCompletionChunk}` events, then `data: [DONE]`; a stream that "
    'fails after it started ends with `data: {"error": {...}}`, then `data: [DONE]`'
)


def _responses(op: Operation, names: Mapping[type[BaseModel], str]) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for status, model in op.ok.items():
        resp: dict[str, Any] = {"description": "success" if status < 400 else "not ready"}
        if model is not None:
            resp["content"] = _json_content(names[model])
        elif op.media is not None and status == 200:
            schema = {"type": "object"} if op.media == JSON else {"type": "string"}
            resp["content"] = {op.media: {"schema": schema}}
        if op.stream and status == 200:
            resp["content"][SSE] = {"schema": _SSE_EVENT, "description": _SSE_DESCRIPTION}
            resp["headers"] = {**_REQUEST_ID, **_RATE_HEADERS}
        if op.links and status < 300:
            resp["links"] = {
                target: {"operationId": target, "parameters": dict(params)}
                for target, params in op.links.items()
            }
        out[str(status)] = resp
    for status in op.errors:
        error = {
            "description": _ERRORS[status],
            "headers": {**_REQUEST_ID, **(_RETRY_AFTER if status == 429 else {})},
            "content": _json_content(names[am.ErrorBody]),
        }
        out[str(status)] = error
    return out


def _operation(op: Operation, names: Mapping[type[BaseModel], str]) -> dict[str, Any]:
    params: list[dict[str, Any]] = [
        {"name": name, "in": "path", "required": True, "schema": _PATH_PARAMS[name]}
        for name in re.findall(r"{(\w+)}", op.path)
    ]
    params += [
        {"name": q.name, "in": "query", "required": False, "schema": dict(q.schema),
         "description": q.description}
        for q in op.query
    ]  # fmt: skip
    out: dict[str, Any] = {
        "operationId": op.op_id,
        "summary": op.summary,
        "tags": [op.tag],
        "security": [{op.security: []}] if op.security else [],
        "responses": _responses(op, names),
    }
    if params:
        out["parameters"] = params
    if op.body is not None:
        out["requestBody"] = {"required": True, "content": _json_content(names[op.body])}
    return out


def _models(operations: tuple[Operation, ...]) -> tuple[list[type[BaseModel]], list[Any]]:
    inputs = [op.body for op in operations if op.body is not None]
    outputs = [m for op in operations for m in op.ok.values() if m is not None]
    outputs += [am.ErrorBody, ChatCompletionChunk]
    return list(dict.fromkeys(inputs)), list(dict.fromkeys(outputs))


def build_document(
    model_name: str | None = None, *, widget_demo: bool = False, version: str = "1"
) -> dict[str, Any]:
    """The document; ``model_name`` (the served model id) is given as the example ``model``;
    ``widget_demo``: the app serves the widget demo page."""
    assert issubclass(ChatRequest, BaseModel), "the chat request schema must be pydantic"
    operations = (*OPERATIONS, WIDGET_DEMO) if widget_demo else OPERATIONS
    inputs, outputs = _models(operations)
    keyed = [(m, "validation") for m in inputs] + [(m, "serialization") for m in outputs]
    key_map, defs = models_json_schema(keyed, ref_template=REF)  # type: ignore[arg-type]
    names = {m: key_map[(m, mode)]["$ref"].rsplit("/", 1)[1] for m, mode in keyed}
    schemas = defs.get("$defs", {})
    chat = schemas[names[ChatRequest]]
    if model_name is not None:
        chat["properties"]["model"]["examples"] = [model_name]
    paths: dict[str, dict[str, Any]] = {}
    for op in operations:
        paths.setdefault(op.path, {})[op.method] = _operation(op, names)
    return {
        "openapi": "3.1.0",
        "info": {
            "title": "kvgate",
            "version": version,
            "description": "OpenAI-compatible chat API with per-tenant pinned system prompts, "
            'and the admin API. Errors are always `{"error": {message, type, param, code}}`.',
        },
        "paths": paths,
        "components": {
            "schemas": schemas,
            "securitySchemes": {
                TENANT_KEY: {
                    "type": "http",
                    "scheme": "bearer",
                    "description": "a tenant API key (kvg_...), from createKey",
                },
                ADMIN_TOKEN: {
                    "type": "http",
                    "scheme": "bearer",
                    "description": "the admin token: KVGATE_ADMIN_TOKEN, or printed once by "
                    "`kvgate serve` on first start",
                },
            },
        },
        "tags": [
            {"name": "chat", "description": "OpenAI-compatible API (tenant keys)"},
            {"name": "admin", "description": "tenants, prompts, keys, limits (admin token)"},
            {"name": "ops", "description": "health, readiness, this document"},
            {"name": "widget", "description": "the embeddable chat widget"},
        ],
    }


def openapi_handler(model_name: str | None, *, widget_demo: bool = False) -> Handler:
    """``GET /openapi.json`` for an app serving ``model_name``; built on first request."""
    body: list[bytes] = []

    async def openapi_json(request: web.Request) -> web.Response:
        if not body:
            doc = build_document(model_name, widget_demo=widget_demo)
            body.append(json.dumps(doc, separators=(",", ":")).encode())
        return web.Response(body=body[0], content_type=JSON)

    return openapi_json
