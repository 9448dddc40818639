"""Routes of the Responses and Conversations APIs.

    POST   /v1/responses                          the chat path (gateway/responses/turn.py)
    GET    /v1/responses/{id}                     a stored response of the caller's owner
    DELETE /v1/responses/{id}
    GET    /v1/responses/{id}/input_items         paged (limit, after, order)
    POST   /v1/conversations                      {metadata?, items?}
    GET    /v1/conversations/{id}                 POST updates its metadata
    DELETE /v1/conversations/{id}
    GET    /v1/conversations/{id}/items           paged; POST appends {items}
    GET    /v1/conversations/{id}/items/{item}    DELETE removes it

Every route authenticates the key as chat does, and reads only the rows of the caller's owner
(gateway/responses/owner.py): an id of another owner or tenant is a 404.
"""

from __future__ import annotations

import json
from typing import Any

from aiohttp import web

from gateway.access.auth import Principal
from gateway.chat.views import serve_turn
from gateway.context import STATE
from gateway.errors import REQUEST_ID, TENANT, ApiError, new_request_id, register_error
from gateway.responses.build import check_system_items
from gateway.responses.history import resolve_references
from gateway.responses.items import parse_input
from gateway.responses.objects import (
    conversation_body,
    deleted_body,
    item_list,
    page_body,
)
from gateway.responses.owner import owner_scope
from gateway.responses.turn import ResponsesTurn
from gateway.widget.cors import add_preflight
from tenants.conversation_records import (
    ConversationNotFound,
    ItemNotFound,
    NewItem,
    Order,
    OwnerGone,
    OwnerScope,
    ResponseNotFound,
)
from tenants.conversation_store import ConversationStore

PATHS = (
    "/v1/responses",
    "/v1/responses/{id}",
    "/v1/responses/{id}/input_items",
    "/v1/conversations",
    "/v1/conversations/{id}",
    "/v1/conversations/{id}/items",
    "/v1/conversations/{id}/items/{item_id}",
)
MAX_LIMIT = 100
MAX_METADATA = 16


async def create_response(request: web.Request) -> web.StreamResponse:
    return await serve_turn(request, ResponsesTurn())


async def _caller(request: web.Request) -> tuple[ConversationStore, OwnerScope]:
    store, scope, _ = await _principal(request)
    return store, scope


async def _principal(request: web.Request) -> tuple[ConversationStore, OwnerScope, Principal]:
    state = request.app[STATE]
    request[REQUEST_ID] = new_request_id()
    principal: Principal = await state.keys.authenticate(request)
    request[TENANT] = principal.runtime.tenant_id
    return ConversationStore(state.store), owner_scope(request, principal), principal


def _storing(principal: Principal) -> None:
    """A tenant that stores no conversations has none to create or add to."""
    if not principal.runtime.conversations.store:
        raise ApiError(
            400,
            "this tenant does not store conversations",
            param="conversation",
            code="store_disabled",
        )


async def _items(
    store: ConversationStore, scope: OwnerScope, doc: dict[str, Any], principal: Principal
) -> list[NewItem]:
    """A body's ``items`` (system / developer ones under the client-system policy; an
    ``item_reference`` as the owner's stored item it names)."""
    raw = doc.get("items")
    if raw is None:
        return []
    if not isinstance(raw, list):
        raise ApiError(400, "items must be an array", param="items")
    check_system_items(raw, principal, "items")
    return await resolve_references(store, scope, parse_input(raw, "items"), "items")


def _json(request: web.Request, body: dict[str, Any]) -> web.Response:
    return web.json_response(body, headers={"x-request-id": request[REQUEST_ID]})


def _paging(request: web.Request) -> tuple[int, str | None, Order]:
    q = request.query
    try:
        limit = int(q.get("limit", "20"))
    except ValueError:
        raise ApiError(400, "limit must be an integer", param="limit") from None
    if not 1 <= limit <= MAX_LIMIT:
        raise ApiError(400, f"limit must be between 1 and {MAX_LIMIT}", param="limit")
    order = q.get("order", "desc")
    if order not in ("asc", "desc"):
        raise ApiError(400, "order must be 'asc' or 'desc'", param="order")
    return limit, q.get("after") or None, "asc" if order == "asc" else "desc"


async def get_response(request: web.Request) -> web.Response:
    store, scope = await _caller(request)
    record = await store.get_response(scope, request.match_info["id"])
    return _json(request, record.body)


async def delete_response(request: web.Request) -> web.Response:
    store, scope = await _caller(request)
    response_id = request.match_info["id"]
    await store.delete_response(scope, response_id)
    return _json(request, deleted_body(response_id, "response"))


async def list_input_items(request: web.Request) -> web.Response:
    store, scope = await _caller(request)
    limit, after, order = _paging(request)
    page = await store.list_input_items(
        scope, request.match_info["id"], limit=limit, after=after, order=order
    )
    return _json(request, page_body(page))


async def _body(request: web.Request) -> dict[str, Any]:
    raw = await request.read()
    if not raw.strip():
        return {}
    try:
        doc = json.loads(raw)
    except ValueError as exc:
        raise ApiError(400, f"request body is not valid JSON: {exc}") from None
    if not isinstance(doc, dict):
        raise ApiError(400, "request body must be a JSON object")
    return doc


def _metadata(doc: dict[str, Any]) -> dict[str, str]:
    meta = doc.get("metadata") or {}
    ok = isinstance(meta, dict) and all(
        isinstance(k, str) and isinstance(v, str) and len(k) <= 64 and len(v) <= 512
        for k, v in meta.items()
    )
    if not ok or len(meta) > MAX_METADATA:
        raise ApiError(
            400,
            "metadata: at most 16 string pairs (keys up to 64, values up to 512 characters)",
            param="metadata",
        )
    return dict(meta)


def _known(doc: dict[str, Any], allowed: tuple[str, ...]) -> None:
    for name in doc:
        if name not in allowed:
            raise ApiError(
                400,
                f"Unrecognized request argument supplied: {name[:64]}",
                param=name[:64],
                code="unknown_parameter",
            )


async def create_conversation(request: web.Request) -> web.Response:
    store, scope, principal = await _principal(request)
    _storing(principal)
    doc = await _body(request)
    _known(doc, ("metadata", "items"))
    items = await _items(store, scope, doc, principal)
    conv = await store.create_conversation(scope, _metadata(doc), items)
    return _json(request, conversation_body(conv))


async def get_conversation(request: web.Request) -> web.Response:
    store, scope = await _caller(request)
    conv = await store.get_conversation(scope, request.match_info["id"])
    return _json(request, conversation_body(conv))


async def update_conversation(request: web.Request) -> web.Response:
    store, scope = await _caller(request)
    doc = await _body(request)
    _known(doc, ("metadata",))
    if "metadata" not in doc:
        raise ApiError(400, "metadata is required", param="metadata")
    conv = await store.update_conversation(scope, request.match_info["id"], _metadata(doc))
    return _json(request, conversation_body(conv))


async def delete_conversation(request: web.Request) -> web.Response:
    store, scope = await _caller(request)
    conv_id = request.match_info["id"]
    await store.delete_conversation(scope, conv_id)
    return _json(request, deleted_body(conv_id, "conversation.deleted"))


async def list_items(request: web.Request) -> web.Response:
    store, scope = await _caller(request)
    limit, after, order = _paging(request)
    page = await store.list_items(
        scope, request.match_info["id"], limit=limit, after=after, order=order
    )
    return _json(request, page_body(page))


async def add_items(request: web.Request) -> web.Response:
    store, scope, principal = await _principal(request)
    _storing(principal)
    doc = await _body(request)
    _known(doc, ("items",))
    items = await _items(store, scope, doc, principal)
    if not items:
        raise ApiError(400, "items must be a non-empty array", param="items")
    added = await store.append_items(scope, request.match_info["id"], items)
    return _json(request, item_list(added, False))


async def get_item(request: web.Request) -> web.Response:
    store, scope = await _caller(request)
    m = request.match_info
    return _json(request, dict((await store.get_item(scope, m["id"], m["item_id"])).data))


async def delete_item(request: web.Request) -> web.Response:
    store, scope = await _caller(request)
    m = request.match_info
    await store.delete_item(scope, m["id"], m["item_id"])
    return _json(request, conversation_body(await store.get_conversation(scope, m["id"])))


def add_routes(app: web.Application) -> None:
    for exc in (ConversationNotFound, ResponseNotFound, ItemNotFound, OwnerGone):
        register_error(exc, 404, "invalid_request_error", "not_found")
    r = app.router
    r.add_post("/v1/responses", create_response)
    r.add_get("/v1/responses/{id}", get_response)
    r.add_delete("/v1/responses/{id}", delete_response)
    r.add_get("/v1/responses/{id}/input_items", list_input_items)
    r.add_post("/v1/conversations", create_conversation)
    r.add_get("/v1/conversations/{id}", get_conversation)
    r.add_post("/v1/conversations/{id}", update_conversation)
    r.add_delete("/v1/conversations/{id}", delete_conversation)
    r.add_get("/v1/conversations/{id}/items", list_items)
    r.add_post("/v1/conversations/{id}/items", add_items)
    r.add_get("/v1/conversations/{id}/items/{item_id}", get_item)
    r.add_delete("/v1/conversations/{id}/items/{item_id}", delete_item)
    add_preflight(app, *PATHS)
