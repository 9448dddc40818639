"""The OpenAPI 3.1 document of the gateway, served at ``GET /openapi.json`` (public, no auth).

Schemas are generated from the pydantic models the views validate with (tenants/schemas.py,
gateway/chat/schemas.py) and the answer models of gateway/openapi/models.py; only the list of
operations (gateway/openapi/operations.py) is written by hand.
``tests/gateway/openapi/test_openapi.py`` checks that it names every route the app serves, and the
schemathesis suite checks every answer against it.
"""

from __future__ import annotations

import json
import re
from collections.abc import Mapping
from typing import Any

from aiohttp import web
from pydantic import BaseModel
from pydantic.json_schema import models_json_schema

from gateway.chat.response_models import ChatCompletionChunk
from gateway.chat.schemas import ChatRequest
from gateway.errors import Handler
from gateway.openapi import models as am
from gateway.openapi.operations import (
    ADMIN_TOKEN,
    ERRORS,
    JSON,
    OPERATIONS,
    REF,
    SSE,
    TENANT_KEY,
    WIDGET_DEMO,
    Operation,
)
from gateway.openapi.responses_ops import responses_operations
from tenants import schemas as ts

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
    "id": {
        "type": "string",
        "description": "tenant id (admin routes); response or conversation id (/v1/responses, "
        "/v1/conversations)",
    },
    "item_id": {"type": "string", "description": "an item id of the conversation"},
    "conversation_id": {"type": "string", "description": "a conversation id"},
    "end_user": {"type": "string", "description": "an end user id (widget sessions)"},
    "version": {"type": "integer", "minimum": 1, "maximum": ts.MAX_LIMIT},
    "key_id": {"type": "string", "description": "key id (from createKey or listKeys)"},
    "model": {"type": "string", "minLength": 1, "maxLength": 200, "description": "model id"},
    "admin_id": {"type": "string", "description": "admin id (from createAdmin or listAdmins)"},
    "path": {"type": "string", "description": "a file of the console (index.html, js/app.js)"},
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
        for media in op.alt_media if status == 200 else ():
            resp.setdefault("content", {})[media] = {"schema": {"type": "string"}}
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
            "description": ERRORS[status],
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
    operations = (*OPERATIONS, *responses_operations())
    if widget_demo:
        operations = (*operations, WIDGET_DEMO)
    inputs, outputs = _models(operations)
    keyed = [(m, "validation") for m in inputs] + [(m, "serialization") for m in outputs]
    key_map, defs = models_json_schema(keyed, ref_template=REF)
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
                    "description": "an admin token: KVGATE_ADMIN_TOKEN (or printed once by "
                    "`kvgate serve` on first start), or one from createAdmin; the console sends "
                    "its session cookie (kvgate_admin) with X-CSRF-Token on writes instead",
                },
            },
        },
        "tags": [
            {"name": "chat", "description": "OpenAI-compatible API (tenant keys)"},
            {
                "name": "responses",
                "description": "OpenAI's Responses and Conversations APIs, stored (tenant keys)",
            },
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
