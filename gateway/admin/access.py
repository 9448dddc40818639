"""What every admin route needs, in one table; ``authorize`` enforces it (gateway/admin/auth.py).

Scopes::

    public    no principal (the console's files, signing in)
    self      any signed-in principal (who am I, signing out)
    tenant    a platform admin, or an admin of the tenant named by the route's ``{id}``
    platform  a platform admin only

``write`` routes need an editor. A tenant admin is answered 404 (exactly as for a tenant that
does not exist) on another tenant's routes, 403 on platform routes; a viewer 403 on writes.
A route of the admin sub-app missing from ``ACCESS`` fails start-up (``check_declared``) and,
should one be added later, is refused at request time (fail closed).

A tenant admin's "limits within what the platform set": the tenant's own limits and budget are
platform writes; its keys' limits, priority and budgets (bounded by the tenant's) are tenant
writes.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import Literal, NamedTuple

from aiohttp import web

from gateway.admin.principal import Principal
from gateway.errors import ApiError
from tenants.errors import TenantNotFound

Scope = Literal["public", "self", "tenant", "platform"]
ADMIN_PREFIX = "/admin"


class Need(NamedTuple):
    scope: Scope
    write: bool


def _read(scope: Scope) -> Need:
    return Need(scope, False)


def _write(scope: Scope) -> Need:
    return Need(scope, True)


T = "/v1/tenants/{id}"
K = f"{T}/keys/{{key_id}}"
ACCESS: Mapping[tuple[str, str], Need] = {
    # console and session (gateway/admin/console.py, session.py)
    ("GET", "/ui"): _read("public"),  # a redirect to /ui/
    ("GET", "/ui/"): _read("public"),
    ("GET", "/ui/{path}"): _read("public"),
    ("POST", "/v1/session"): _read("public"),  # signs in: the token is in the body
    ("GET", "/v1/session"): _read("self"),
    ("GET", "/v1/session/status"): _read("public"),  # signed in or not: the cookie's answer
    ("DELETE", "/v1/session"): _read("self"),  # signing out is no write: viewers may
    # admin principals (gateway/admin/admins.py)
    ("POST", "/v1/admins"): _write("platform"),
    ("GET", "/v1/admins"): _read("platform"),
    ("GET", "/v1/admins/{admin_id}"): _read("platform"),
    ("DELETE", "/v1/admins/{admin_id}"): _write("platform"),
    # tenants (gateway/admin/views.py)
    ("POST", "/v1/tenants"): _write("platform"),
    ("GET", "/v1/tenants"): _read("platform"),
    ("GET", T): _read("tenant"),
    ("PATCH", T): _write("platform"),
    ("DELETE", T): _write("platform"),
    ("PUT", f"{T}/system-prompt"): _write("tenant"),
    ("GET", f"{T}/system-prompts"): _read("tenant"),
    ("GET", f"{T}/system-prompts/{{version}}"): _read("tenant"),
    ("POST", f"{T}/system-prompts/{{version}}/activate"): _write("tenant"),
    ("POST", f"{T}/keys"): _write("tenant"),
    ("GET", f"{T}/keys"): _read("tenant"),
    ("DELETE", K): _write("tenant"),
    ("PUT", f"{K}/limits"): _write("tenant"),
    ("PUT", f"{K}/priority"): _write("tenant"),
    ("PUT", f"{T}/limits"): _write("platform"),
    ("GET", f"{T}/cache"): _read("tenant"),
    ("GET", f"{T}/audit"): _read("tenant"),
    ("GET", "/v1/audit"): _read("platform"),
    # widget settings (gateway/admin/widget.py)
    ("GET", f"{T}/widget"): _read("tenant"),
    ("PUT", f"{T}/widget"): _write("tenant"),
    ("POST", f"{T}/widget/rotate-secret"): _write("tenant"),
    # operators' transcripts (gateway/admin/transcripts.py): every read audited
    ("GET", f"{T}/transcripts"): _read("tenant"),
    ("GET", f"{T}/transcripts/{{conversation_id}}"): _read("tenant"),
    ("DELETE", f"{T}/transcripts/{{conversation_id}}"): _write("tenant"),
    ("GET", f"{T}/transcript-access"): _read("tenant"),
    ("PUT", f"{T}/transcript-access"): _write("tenant"),
    # tenant tools: webhook signing secret, MCP servers (gateway/admin/tools.py)
    ("POST", f"{T}/tool-secret/rotate"): _write("tenant"),
    ("POST", f"{T}/mcp-servers"): _write("tenant"),
    ("GET", f"{T}/mcp-servers"): _read("tenant"),
    # stored conversations (gateway/admin/conversations.py)
    ("DELETE", f"{T}/conversations/{{conversation_id}}"): _write("tenant"),
    ("DELETE", f"{T}/end-users/{{end_user}}/conversations"): _write("tenant"),
    ("DELETE", f"{K}/conversations"): _write("tenant"),
    # cluster (gateway/cluster/admin.py)
    ("GET", "/v1/cluster"): _read("platform"),
    # usage ledger and prices (gateway/usage/admin.py)
    ("GET", f"{T}/usage"): _read("tenant"),
    ("GET", f"{T}/usage/records"): _read("tenant"),
    ("GET", "/v1/usage"): _read("platform"),
    ("GET", "/v1/prices"): _read("platform"),
    ("PUT", "/v1/prices/{model}"): _write("platform"),
    ("DELETE", "/v1/prices/{model}"): _write("platform"),
    # budgets (gateway/usage/budget_admin.py)
    ("PUT", f"{T}/budget"): _write("platform"),
    ("GET", f"{T}/budget"): _read("tenant"),
    ("PUT", f"{K}/budget"): _write("tenant"),
    ("GET", f"{K}/budget"): _read("tenant"),
}


def route_path(canonical: str) -> str:
    """A route's path as ``ACCESS`` names it (without the sub-app's mount prefix)."""
    return canonical.removeprefix(ADMIN_PREFIX) if canonical.startswith("/admin/") else canonical


def need_of(method: str, canonical: str) -> Need | None:
    method = "GET" if method == "HEAD" else method
    return ACCESS.get((method, route_path(canonical)))


def declared_routes(app: web.Application) -> Iterable[tuple[str, str]]:
    """Every (method, path) the sub-app routes (HEAD: answered as its GET; a ``*`` route has
    no rule, so start-up refuses it)."""
    for route in app.router.routes():
        if route.method != "HEAD":
            yield route.method, route_path(route.resource.canonical if route.resource else "")


def check_declared(app: web.Application) -> None:
    """Raise unless every route is in ``ACCESS``, tenant routes name ``{id}`` and every
    undeclared-write non-GET route is a public or self one (start-up check)."""
    problems: list[str] = []
    for method, path in declared_routes(app):
        need = need_of(method, path)
        if need is None:
            problems.append(f"{method} {path}: no access declaration")
        elif need.scope == "tenant" and "{id}" not in path:
            problems.append(f"{method} {path}: tenant-scoped without an {{id}}")
        elif method != "GET" and not need.write and need.scope not in ("public", "self"):
            problems.append(f"{method} {path}: a {method} declared as a read")
    if problems:
        raise RuntimeError(
            "admin routes without a valid access rule (gateway/admin/access.py): "
            + "; ".join(problems)
        )


async def check_declared_on_startup(app: web.Application) -> None:
    check_declared(app)


def authorize(principal: Principal, need: Need, request: web.Request) -> None:
    """Raise unless ``principal`` may call a route that needs ``need`` (scope before write:
    a tenant admin learns nothing of other tenants, not even that a route writes)."""
    if need.scope == "platform" and not principal.platform:
        raise ApiError(
            403,
            "this route needs a platform admin",
            type_="permission_error",
            code="platform_admin_required",
        )
    if need.scope == "tenant" and not principal.platform:
        tenant_id = request.match_info.get("id", "")
        if tenant_id != principal.tenant_id:
            raise TenantNotFound(tenant_id)
    if need.write and not principal.editor:
        raise ApiError(
            403, "this admin token can only read", type_="permission_error", code="read_only"
        )
