"""The Responses and Conversations routes of the OpenAPI document (gateway/responses/views.py,
gateway/admin/conversations.py). Answers are OpenAI's objects (``Response``,
``ConversationResource``, item lists: OpenAI's published schemas, docs/api.md), declared here as
JSON objects."""

from __future__ import annotations

from gateway.openapi.operations import ADMIN, ADMIN_TOKEN, JSON, TENANT_KEY, Operation, Query
from gateway.responses.request import ResponsesRequest

_R = "/v1/responses/{id}"
_C = "/v1/conversations/{id}"
_PAGING = (
    Query("limit", {"type": "integer", "minimum": 1, "maximum": 100}, "page size (default 20)"),
    Query("order", {"type": "string", "enum": ["asc", "desc"]}, "default desc"),
    Query("after", {"type": "string"}, "an item id: the page after it"),
)
_READ = (401, 403, 404, 503)
_WRITE = (400, 401, 403, 404, 413, 503)


def _op(
    method: str,
    path: str,
    op_id: str,
    summary: str,
    errors: tuple[int, ...],
    query: tuple[Query, ...] = (),
) -> Operation:
    ok: dict[int, None] = {200: None}
    return Operation(
        method, path, op_id, summary, "responses", TENANT_KEY, ok, errors, query=query, media=JSON
    )


def responses_operations() -> tuple[Operation, ...]:
    t = f"{ADMIN}/tenants/{{id}}"
    admin_errors = (401, 403, 404, 429, 503)
    return (
        Operation(
            "post", "/v1/responses", "createResponse",
            "OpenAI Responses API: a turn, stored by default (JSON, or the Responses event "
            "stream with stream=true)", "responses", TENANT_KEY, {200: None},
            (400, 401, 403, 404, 413, 429, 503), body=ResponsesRequest, media=JSON,
        ),
        _op("get", _R, "getResponse", "a stored response of the caller", _READ),
        _op("delete", _R, "deleteResponse", "delete a stored response", _READ),
        _op("get", f"{_R}/input_items", "listInputItems", "a response's input items",
            (400, *_READ), query=_PAGING),
        _op("post", "/v1/conversations", "createConversation", "a new conversation",
            _WRITE),
        _op("get", _C, "getConversation", "a conversation of the caller", _READ),
        _op("post", _C, "updateConversation", "replace a conversation's metadata", _WRITE),
        _op("delete", _C, "deleteConversation", "delete a conversation with its items",
            _READ),
        _op("get", f"{_C}/items", "listConversationItems", "a conversation's items",
            (400, *_READ), query=_PAGING),
        _op("post", f"{_C}/items", "addConversationItems", "append items", _WRITE),
        _op("get", f"{_C}/items/{{item_id}}", "getConversationItem", "one item", _READ),
        _op("delete", f"{_C}/items/{{item_id}}", "deleteConversationItem",
            "delete one item (answers the conversation)", _READ),
        Operation(
            "delete", f"{t}/conversations/{{conversation_id}}", "deleteTenantConversation",
            "delete one stored conversation (audited)", "admin", ADMIN_TOKEN, {200: None},
            admin_errors, media=JSON,
        ),
        Operation(
            "delete", f"{t}/end-users/{{end_user}}/conversations", "deleteEndUserData",
            "delete everything an end user stored (audited)", "admin", ADMIN_TOKEN,
            {200: None}, admin_errors, media=JSON,
        ),
        Operation(
            "delete", f"{t}/keys/{{key_id}}/conversations", "deleteKeyConversations",
            "delete everything stored through a key (audited)", "admin", ADMIN_TOKEN,
            {200: None}, admin_errors, media=JSON,
        ),
    )  # fmt: skip
