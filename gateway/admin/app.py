"""``create_admin_app``: the admin sub-app; mount it with ``app.add_subapp(ADMIN_PREFIX, sub)``.

Routes (relative to ``ADMIN_PREFIX`` = ``/admin``; see docs of gateway/admin/views.py):
    POST/GET /v1/tenants, GET/PATCH/DELETE /v1/tenants/{id}, PUT /v1/tenants/{id}/system-prompt,
    GET /v1/tenants/{id}/system-prompts, GET /v1/tenants/{id}/system-prompts/{version},
    POST /v1/tenants/{id}/system-prompts/{version}/activate, POST/GET /v1/tenants/{id}/keys,
    DELETE /v1/tenants/{id}/keys/{key_id}, PUT /v1/tenants/{id}/keys/{key_id}/limits,
    PUT /v1/tenants/{id}/keys/{key_id}/priority,
    PUT /v1/tenants/{id}/limits, GET /v1/tenants/{id}/cache, GET /v1/tenants/{id}/audit,
    GET /v1/audit; POST/GET /v1/admins, GET/DELETE /v1/admins/{admin_id} (admins.py);
    POST/GET/DELETE /v1/session, GET /v1/session/status (session_views.py); the console at
    /ui/ (console.py).

Who may call what: gateway/admin/access.py (checked at start-up for every route, including
those other modules add after ``create_admin_app``).
"""

from __future__ import annotations

from aiohttp import web

from gateway.admin.access import check_declared_on_startup
from gateway.admin.admins import add_admin_routes
from gateway.admin.auth import admin_auth_middleware
from gateway.admin.console import add_console_routes
from gateway.admin.context import ADMIN_CONTEXT, AdminContext, CacheProvider, PromptLimit
from gateway.admin.conversations import add_conversation_admin_routes
from gateway.admin.principal import PrincipalCache
from gateway.admin.session import MemorySessionStore, SessionStore
from gateway.admin.session_views import add_session_routes
from gateway.admin.throttle import AdminThrottle
from gateway.admin.tools import add_tool_admin_routes
from gateway.admin.transcripts import add_transcript_routes
from gateway.admin.views import add_routes
from gateway.admin.widget import add_widget_admin_routes
from gateway.errors import Handler, error_middleware, register_error
from tenants import errors as te
from tenants.admins import AdminStore
from tenants.store import TenantStore

ADMIN_PREFIX = "/admin"


def register_tenant_errors() -> None:
    """Map tenant-store errors to HTTP (idempotent)."""
    register_error(te.TenantNotFound, 404, "not_found_error", "tenant_not_found")
    register_error(te.KeyNotFound, 404, "not_found_error", "key_not_found")
    register_error(te.PromptVersionNotFound, 404, "not_found_error", "prompt_version_not_found")
    register_error(te.AdminNotFound, 404, "not_found_error", "admin_not_found")
    register_error(te.TenantExists, 409, "invalid_request_error", "tenant_exists")
    register_error(te.TenantDeleted, 409, "invalid_request_error", "tenant_deleted")
    register_error(te.PromptChanged, 409, "invalid_request_error", "prompt_changed")
    register_error(te.InvalidField, 422, "invalid_request_error", "invalid_field")
    register_error(te.PromptTooLong, 422, "invalid_request_error", "prompt_too_long")
    register_error(te.StoreUnavailable, 503, "service_unavailable", "database_unavailable")


@web.middleware
async def no_nul_params(request: web.Request, handler: Handler) -> web.StreamResponse:
    """Path and query values holding NUL name nothing in the store (PostgreSQL text cannot hold
    NUL): refused before any query sees them."""
    for name, value in (*request.match_info.items(), *request.query.items()):
        if "\x00" in value:
            raise te.InvalidField(f"{name}: must not contain NUL characters", param=name)
    return await handler(request)


def create_admin_app(
    store: TenantStore,
    *,
    admin_token_sha256: str | None,
    prompt_limit: PromptLimit | None = None,
    cache_provider: CacheProvider | None = None,
    actor: str = "admin",
    sessions: SessionStore | None = None,
    principal_ttl_s: float = 5.0,
    throttle: AdminThrottle | None = None,
) -> web.Application:
    """The admin sub-app. ``admin_token_sha256``: the bootstrap token (a platform editor;
    None: only tokens of ``admin_principals`` are accepted).

    ``prompt_limit`` bounds system prompts (422 with the limit; none: unbounded);
    ``cache_provider(tenant_id)`` answers GET .../cache (503 when not given); ``sessions``:
    the console's session store (default: in memory, 30 min idle, 12 h at most);
    ``principal_ttl_s``: how long a token's principal is cached; ``throttle``: writes per
    principal and failed sign-ins per address (default: 60 and 10 a minute, in process). The
    store and its engine belong to the caller.
    """
    register_tenant_errors()
    principals = PrincipalCache(AdminStore(store), admin_token_sha256, ttl_s=principal_ttl_s)
    store.bus.subscribe(principals.on_event)
    sessions = sessions or MemorySessionStore()
    throttle = throttle or AdminThrottle()
    auth = admin_auth_middleware(principals, sessions, throttle)
    app = web.Application(middlewares=[error_middleware, auth, no_nul_params])
    app[ADMIN_CONTEXT] = AdminContext(
        store=store,
        prompt_limit=prompt_limit,
        cache_provider=cache_provider,
        default_actor=actor,
        principals=principals,
        sessions=sessions,
        throttle=throttle,
    )
    add_routes(app)
    add_widget_admin_routes(app)  # PUT/GET /v1/tenants/{id}/widget, POST .../rotate-secret
    add_conversation_admin_routes(app)  # DELETE stored conversations, an end user's data
    add_admin_routes(app)
    add_session_routes(app)
    add_console_routes(app)
    app.on_startup.append(check_declared_on_startup)  # after every module added its routes
    add_tool_admin_routes(app)  # tool secret, MCP servers (gateway/admin/tools.py)
    add_transcript_routes(app)  # operators' transcripts (gateway/admin/transcripts.py)
    return app
