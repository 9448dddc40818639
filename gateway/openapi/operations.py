"""The operations of the gateway's OpenAPI document (gateway/openapi/document.py builds it): one
``Operation`` per route, written by hand; the schemas come from the pydantic models named here.
``tests/gateway/openapi/test_openapi.py`` checks that the list names every route the app serves.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from pydantic import BaseModel

from gateway.admin import session_views as sv
from gateway.chat.response_models import ChatCompletion
from gateway.chat.schemas import ChatRequest
from gateway.openapi import models as am
from gateway.usage import api_models as um
from gateway.usage import budget_admin as ub
from gateway.widget.views import SessionIn
from tenants import admin_schemas as tas
from tenants import mcp_store as ms
from tenants import schemas as ts
from tenants import transcript_schemas as tr

REF = "#/components/schemas/{model}"
TENANT_KEY = "tenantKey"
ADMIN_TOKEN = "adminToken"
JSON = "application/json"
SSE = "text/event-stream"
ADMIN = "/admin/v1"

ERRORS = {
    400: "malformed request (not JSON, wrong types, unknown or unsupported parameters, a schema "
    "the grammar engine cannot enforce)",
    401: "missing or invalid bearer token",
    403: "tenant suspended, a widget key used from an origin it is not bound to, or an admin "
    "token whose scope or access does not allow the route (docs/api.md)",
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
    alt_media: tuple[str, ...] = ()  # other success content types (text/csv with format=csv)
    links: Mapping[str, Mapping[str, str]] = field(default_factory=dict)  # op_id -> params


_PAGE = (
    Query("limit", {"type": "integer", "minimum": 1, "maximum": 200}, "page size (default 50)"),
    Query("cursor", {"type": "string"}, "next_cursor of the previous page"),
)
_BODY_ERRORS = (400, 413, 422)
_ADMIN_ERRORS = (401, 429, 503)
_T = f"{ADMIN}/tenants/{{id}}"
_TENANT_LINK = {"id": "$response.body#/id"}
_SAME_TENANT = {"id": "$request.path.id"}


def _admin(
    method: str, path: str, op_id: str, summary: str, ok: Mapping[int, Any], *errors: int, **kw: Any
) -> Operation:
    errs = (*_ADMIN_ERRORS, *errors, *(_BODY_ERRORS if "body" in kw else ()))
    return Operation(method, path, op_id, summary, "admin", ADMIN_TOKEN, ok, errs, **kw)


def _principal_operations() -> tuple[Operation, ...]:
    """Admin principals, console sessions, a tenant's audit, the console's files."""
    admin_id = f"{ADMIN}/admins/{{admin_id}}"
    html = "text/html"
    return (
        _admin("post", f"{ADMIN}/admins", "createAdmin",
               "create an admin principal (the token is returned only here)",
               {201: tas.AdminCreated}, 403, body=tas.AdminCreate),
        _admin("get", f"{ADMIN}/admins", "listAdmins", "admin principals, newest first",
               {200: tas.AdminList}, 403, 422,
               query=(Query("scope", {"type": "string"}, '"platform" or a tenant id'),)),
        _admin("get", admin_id, "getAdmin", "one admin principal", {200: tas.AdminOut}, 403, 404,
               422),
        _admin("delete", admin_id, "revokeAdmin", "revoke an admin token (idempotent)",
               {200: tas.AdminOut}, 403, 404, 422),
        Operation("post", f"{ADMIN}/session", "signIn",
                  "exchange an admin token for the console's session cookie and CSRF token",
                  "admin", None, {201: sv.AdminSessionOut},
                  (*_BODY_ERRORS, 401, 403, 429, 503),
                  body=sv.AdminSignIn),
        _admin("get", f"{ADMIN}/session", "whoAmI", "the calling principal", {200: sv.WhoAmI}),
        _admin("delete", f"{ADMIN}/session", "signOut", "end the console session",
               {200: sv.SignedOut}, 403),
        Operation("get", f"{ADMIN}/session/status", "sessionStatus",
                  "whether the console's cookie holds a session (200 either way)", "admin",
                  None, {200: sv.SessionStatus}),
        _admin("get", f"{_T}/audit", "listTenantAudit", "one tenant's audit log, newest first",
               {200: ts.AuditPage}, 403, 404, 422, query=_PAGE),
        Operation("get", "/admin/ui", "consoleRedirect", "redirects to /admin/ui/", "admin",
                  None, {308: None}),
        Operation("get", "/admin/ui/", "console", "the admin console", "admin", None,
                  {200: None}, media=html),
        Operation("get", "/admin/ui/{path}", "consoleFile", "a file of the admin console",
                  "admin", None, {200: None}, (404, 422), media="text/javascript"),
    )  # fmt: skip


def _widget_history_operations() -> tuple[Operation, ...]:
    """The widget's conversation on the server (session tokens; docs/widget.md)."""
    conv = "/v1/widget/conversations"
    return (
        Operation("get", "/v1/widget/conversation", "getWidgetConversation",
                  "the session visitor's current conversation (history on)", "widget",
                  TENANT_KEY, {200: am.WidgetConversation}, (401, 403, 503)),
        Operation("post", conv, "newWidgetConversation",
                  "New conversation: the current one ends, an empty one starts", "widget",
                  TENANT_KEY, {201: am.WidgetConversation}, (401, 403, 503)),
        Operation("delete", f"{conv}/{{conversation_id}}", "deleteWidgetConversation",
                  "delete one of the session visitor's conversations", "widget", TENANT_KEY,
                  {200: am.ConversationDeleted}, (401, 403, 404, 503)),
    )  # fmt: skip


def _transcript_operations() -> tuple[Operation, ...]:
    """Operators' transcripts (every list and read audited)."""
    one = f"{_T}/transcripts/{{conversation_id}}"
    access = f"{_T}/transcript-access"
    return (
        _admin("get", f"{_T}/transcripts", "listTranscripts",
               "the tenant's stored conversations, newest first (audited; 403 when the "
               "tenant turned transcript access off)", {200: tr.TranscriptPageOut}, 403, 404,
               422, query=(*_PAGE, Query("end_user", {"type": "string"}, "one owner only"))),
        _admin("get", one, "readTranscript", "one conversation as a transcript (audited)",
               {200: tr.TranscriptOut}, 403, 404, 422),
        _admin("delete", one, "deleteTranscript", "delete a stored conversation",
               {200: am.ConversationDeleted}, 403, 404, 422),
        _admin("get", access, "getTranscriptAccess", "whether operators may read transcripts",
               {200: tr.TranscriptAccessOut}, 403, 404, 422),
        _admin("put", access, "setTranscriptAccess", "turn transcript access on or off",
               {200: tr.TranscriptAccessOut}, 403, 404, 409, body=tr.TranscriptAccessIn),
    )  # fmt: skip


def _links(params: Mapping[str, str], *op_ids: str) -> dict[str, Mapping[str, str]]:
    """OpenAPI links from a success answer to ``op_ids``, each given the same ``params``."""
    return {op_id: params for op_id in op_ids}


def _usage_operations() -> tuple[Operation, ...]:
    """The ledger's routes (gateway/usage/admin.py)."""
    hour = "ISO 8601, a whole hour; no offset: UTC"
    span = (
        Query("start", {"type": "string"}, f"{hour} (default: end - 24 h)"),
        Query("end", {"type": "string"}, f"{hour} (default: the next whole hour)"),
        Query("limit", {"type": "integer", "minimum": 1, "maximum": 1000}, "default 100"),
        Query("cursor", {"type": "string"}, "next_cursor of the previous page"),
        Query("format", {"type": "string", "enum": ["json", "csv"]}, "csv: every row"),
    )
    groups = ["hour", "day", "key", "end_user", "model"]
    csv_ = ("text/csv",)
    return (
        _admin(
            "get", f"{_T}/usage", "getTenantUsage",
            "a tenant's usage from the rollups, grouped by hour, day, key, end user or model",
            {200: um.UsageReport}, 404, 422, alt_media=csv_,
            query=(*span, Query("group_by", {"type": "string", "enum": groups}, "default day")),
        ),
        _admin(
            "get", f"{ADMIN}/usage", "getUsage", "every tenant's usage, grouped",
            {200: um.UsageReport}, 422, alt_media=csv_,
            query=(
                *span,
                Query("group_by", {"type": "string", "enum": ["tenant", *groups]}, "tenant"),
            ),
        ),
        _admin(
            "get", f"{_T}/usage/records", "listUsageRecords",
            "a tenant's raw usage records in [start, end), by time", {200: um.UsageRecordPage},
            404, 422, alt_media=csv_, query=span,
        ),
        _admin(
            "put", f"{_T}/budget", "setBudget",
            "replace the tenant's budget (tokens and/or spend per day and month)",
            {200: ub.BudgetOut}, 404, body=ub.BudgetIn,
        ),
        _admin("get", f"{_T}/budget", "getBudget", "the tenant's budget", {200: ub.BudgetOut}, 404),
        _admin(
            "put", f"{_T}/keys/{{key_id}}/budget", "setKeyBudget",
            "replace a key's budget (applies within the tenant's)", {200: ub.BudgetOut}, 404,
            body=ub.BudgetIn,
        ),
        _admin(
            "get", f"{_T}/keys/{{key_id}}/budget", "getKeyBudget", "a key's budget",
            {200: ub.BudgetOut}, 404,
        ),
        _admin("get", f"{ADMIN}/prices", "listPrices", "model prices", {200: um.PriceList}),
        _admin(
            "put", f"{ADMIN}/prices/{{model}}", "setPrice", "set a model's price (admin)",
            {200: um.PriceOut}, body=um.PriceIn,
        ),
        _admin(
            "delete", f"{ADMIN}/prices/{{model}}", "deletePrice",
            "remove a model's admin price (the configured one applies again)", {204: None},
        ),
    )  # fmt: skip


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
    Operation(
        "get", "/", "home", "a page linking the widget demo, the console and this reference",
        "ops", None, {200: None}, media="text/html",
    ),
    Operation(
        "get", "/favicon.ico", "favicon", "the gateway's icon (ETag; 304 for If-None-Match)",
        "ops", None, {200: None, 304: None}, media="image/vnd.microsoft.icon",
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
    *_widget_history_operations(),
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
        "put", f"{_T}/system-prompt", "setSystemPrompt",
        "add a prompt version (text and tools), made active; malformed tools are 400s",
        {200: ts.PromptVersion}, 400, 404, 409, body=ts.PromptSet,
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
        "put", f"{_T}/keys/{{key_id}}/priority", "setKeyPriority",
        "the engine's class of the key's requests (interactive | batch)",
        {200: ts.KeyOut}, 404, 409, body=ts.KeyPriorityIn,
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
        "post", f"{_T}/tool-secret/rotate", "rotateToolSecret",
        "new webhook signing secret (returned only here; the old one stops at once)",
        {200: ts.ToolSecret}, 404, 409, 422,
    ),
    _admin(
        "post", f"{_T}/mcp-servers", "addMcpServer",
        "add an MCP server: its tools are listed now (tools/list) and kept as a snapshot; "
        "unreachable or refused by the egress rules: 400",
        {201: ms.McpServerOut}, 400, 404, 409, 503, body=ms.McpServerIn,
    ),
    _admin(
        "get", f"{_T}/mcp-servers", "listMcpServers", "the tenant's MCP servers (never a token)",
        {200: ms.McpServerList}, 404, 422,
    ),
    _admin(
        "get", f"{ADMIN}/cluster", "getCluster", "workers, health, load and prompt placement",
        {200: am.ClusterReport},
    ),
    *_usage_operations(),
    *_principal_operations(),
    *_transcript_operations(),
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
