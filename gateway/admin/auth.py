"""Admin authentication and authorization, one middleware for every route of the sub-app.

Order: the route's access rule (gateway/admin/access.py; none: refused) -> public routes pass
-> the caller: ``Authorization: Bearer <admin token>`` (refused at once from an address blocked
for failed sign-ins; a wrong token counts as one: gateway/admin/throttle.py), else the console's
session cookie (with ``X-CSRF-Token`` on anything but GET/HEAD) -> ``authorize`` -> a write
takes one of its principal's writes per minute -> the handler, with the principal in
``CURRENT_PRINCIPAL`` (audit rows name it) and ``request[PRINCIPAL]``.
"""

from __future__ import annotations

import contextlib
import hmac

import structlog
from aiohttp import web

from gateway.admin.access import Need, authorize, need_of
from gateway.admin.context import CURRENT_PRINCIPAL, PRINCIPAL, SESSION
from gateway.admin.principal import Principal, PrincipalCache
from gateway.admin.session import (
    COOKIE,
    CSRF_HEADER,
    Session,
    SessionStore,
    SessionsUnavailable,
)
from gateway.admin.throttle import AdminThrottle
from gateway.errors import ApiError, Handler, Middleware

READS = ("GET", "HEAD")
log = structlog.get_logger(__name__)


def _unauthorized(message: str, code: str = "invalid_admin_token") -> ApiError:
    return ApiError(
        401,
        message,
        type_="authentication_error",
        code=code,
        headers={"WWW-Authenticate": 'Bearer realm="kvgate-admin"'},
    )


def _need(request: web.Request) -> Need | None:
    """The rule of the matched route; unmatched paths (404/405 answers) need a principal."""
    if request.match_info.http_exception is not None:
        return Need("self", False)
    resource = request.match_info.route.resource
    return need_of(request.method, resource.canonical if resource else "")


async def _from_bearer(
    cache: PrincipalCache, throttle: AdminThrottle, request: web.Request, token: str
) -> Principal:
    address = throttle.address(request)
    throttle.check_sign_in(address)
    principal = await cache.resolve(token.strip())
    if principal is None:
        await throttle.failed_sign_in(address)
        raise _unauthorized("invalid admin token")
    return principal


async def _from_cookie(
    cache: PrincipalCache, sessions: SessionStore, request: web.Request
) -> Principal:
    sid = request.cookies[COOKIE]
    session = await sessions.get(sid)  # None also when the store cannot answer
    if session is None:
        raise _unauthorized("the console session has expired: sign in again", "session_expired")
    if request.method not in READS:
        sent = request.headers.get(CSRF_HEADER, "")
        if not hmac.compare_digest(sent.encode(), session.csrf.encode()):
            raise ApiError(
                403,
                f"missing or wrong {CSRF_HEADER} header",
                type_="permission_error",
                code="csrf_failed",
            )
    principal = await _session_principal(cache, sessions, sid, session)
    if principal is None:
        raise _unauthorized("the admin token of this session is no longer valid", "session_expired")
    request[SESSION] = session
    return principal


async def _session_principal(
    cache: PrincipalCache, sessions: SessionStore, sid: str, session: Session
) -> Principal | None:
    principal = await cache.resolve_digest(session.digest)
    if principal is None:  # revoked or expired since sign-in
        with contextlib.suppress(SessionsUnavailable):  # refused either way; idle TTL ends it
            await sessions.close(sid)
    return principal


async def cookie_session(
    cache: PrincipalCache, sessions: SessionStore, request: web.Request
) -> tuple[Principal, Session] | None:
    """The principal and session of the console's cookie, or None (no cookie, the session
    ended, its token was revoked); for reads (no CSRF token is asked)."""
    sid = request.cookies.get(COOKIE)
    session = await sessions.get(sid) if sid else None
    if sid is None or session is None:
        return None
    principal = await _session_principal(cache, sessions, sid, session)
    return None if principal is None else (principal, session)


async def authenticate(
    cache: PrincipalCache, sessions: SessionStore, throttle: AdminThrottle, request: web.Request
) -> Principal:
    scheme, _, token = request.headers.get("Authorization", "").partition(" ")
    if scheme.lower() == "bearer" and token.strip():
        return await _from_bearer(cache, throttle, request, token)
    if request.cookies.get(COOKIE):
        return await _from_cookie(cache, sessions, request)
    raise _unauthorized("missing admin bearer token")


def _log_write(request: web.Request, principal: Principal, outcome: int | str) -> None:
    """One line per admin write: who, what, and the status (or the error it raised)."""
    resource = request.match_info.route.resource
    route = resource.canonical if resource else "unmatched"
    log.info(
        "admin_write", principal=principal.id, method=request.method, route=route, outcome=outcome
    )


def admin_auth_middleware(
    cache: PrincipalCache, sessions: SessionStore, throttle: AdminThrottle
) -> Middleware:
    @web.middleware
    async def middleware(request: web.Request, handler: Handler) -> web.StreamResponse:
        need = _need(request)
        if need is None:  # a route nobody declared (start-up refuses these): fail closed
            raise ApiError(
                403, "this route has no access rule", type_="permission_error", code="undeclared"
            )
        if need.scope == "public":
            return await handler(request)
        principal = await authenticate(cache, sessions, throttle, request)
        authorize(principal, need, request)
        if need.write:
            await throttle.write(principal.id)
        request[PRINCIPAL] = principal
        reset = CURRENT_PRINCIPAL.set(principal)
        outcome: int | str = "cancelled"
        try:
            response = await handler(request)
            outcome = response.status
            return response
        except web.HTTPException as exc:
            outcome = exc.status
            raise
        except Exception as exc:  # a domain error: the error middleware answers it
            outcome = type(exc).__name__
            raise
        finally:
            CURRENT_PRINCIPAL.reset(reset)
            if request.method not in READS:  # every write, also those without an audit row
                _log_write(request, principal, outcome)

    return middleware
