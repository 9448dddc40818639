"""``/v1/session``: sign in to the console (token -> cookie + CSRF token), who am I, sign out;
``/v1/session/status``: whether the console's cookie holds a session (public: the console asks
it before signing in, and "no" is an answer, not an error).

A wrong token at sign-in counts against its client address (gateway/admin/throttle.py); an
address blocked for failed sign-ins gets a 429 before its token is looked at."""

from __future__ import annotations

from datetime import datetime
from urllib.parse import urlsplit

from aiohttp import web
from pydantic import BaseModel, Field

from gateway.admin.auth import cookie_session
from gateway.admin.context import ADMIN_CONTEXT, PRINCIPAL, SESSION
from gateway.admin.principal import Principal
from gateway.admin.session import COOKIE, SessionsUnavailable, clear_cookie, set_cookie
from gateway.errors import ApiError
from gateway.widget.body import read_json
from tenants.admin_schemas import Access
from tenants.admins import token_sha256
from tenants.schemas import RequestModel, parse


class AdminSignIn(RequestModel):
    token: str = Field(min_length=1, max_length=512)


class PrincipalOut(BaseModel):
    id: str
    scope: str  # "platform" or a tenant id
    access: Access
    expires_at: datetime | None

    @classmethod
    def of(cls, p: Principal) -> PrincipalOut:
        return cls(id=p.id, scope=p.scope, access=p.access, expires_at=p.expires_at)


class AdminSessionOut(BaseModel):
    csrf_token: str  # send it as X-CSRF-Token on every write
    principal: PrincipalOut
    idle_s: float
    max_s: float


class WhoAmI(BaseModel):
    principal: PrincipalOut
    csrf_token: str | None = None  # with the console's cookie only


class SignedOut(BaseModel):
    signed_out: bool


class SessionStatus(BaseModel):
    """The console's session, if its cookie holds one (else only ``signed_in: false``)."""

    signed_in: bool
    principal: PrincipalOut | None = None
    csrf_token: str | None = None


def _answer(model: BaseModel, status: int = 200) -> web.Response:
    return _no_store(web.json_response(model.model_dump(mode="json"), status=status))


def _no_store(response: web.Response) -> web.Response:
    response.headers["Cache-Control"] = "no-store"
    return response


def _unavailable(exc: SessionsUnavailable) -> ApiError:
    return ApiError(
        503, f"{exc}: try again shortly", type_="service_unavailable", code="sessions_unavailable"
    )


def _same_origin(request: web.Request) -> None:
    """Signing in takes JSON from this origin only: a cross-site form cannot send JSON, and a
    browser names the page's origin (login CSRF: a victim signed in as the attacker)."""
    if request.content_type != "application/json":
        raise ApiError(400, "sign in with a JSON body (Content-Type: application/json)")
    origin = request.headers.get("Origin")
    if origin is not None and urlsplit(origin).netloc != request.host:
        raise ApiError(
            403, "sign-in from another origin", type_="permission_error", code="cross_origin"
        )


async def sign_in(request: web.Request) -> web.Response:
    _same_origin(request)
    data = parse(AdminSignIn, await read_json(request))
    ctx = request.app[ADMIN_CONTEXT]
    address = ctx.throttle.address(request)
    ctx.throttle.check_sign_in(address)
    digest = token_sha256(data.token.strip())
    principal = await ctx.principals.resolve_digest(digest)
    if principal is None:
        await ctx.throttle.failed_sign_in(address)
        raise ApiError(
            401, "invalid admin token", type_="authentication_error", code="invalid_admin_token"
        )
    try:
        sid, session = await ctx.sessions.open(digest, principal.id)
    except SessionsUnavailable as exc:
        raise _unavailable(exc) from exc
    body = AdminSessionOut(
        csrf_token=session.csrf,
        principal=PrincipalOut.of(principal),
        idle_s=ctx.sessions.idle_s,
        max_s=ctx.sessions.max_s,
    )
    response = _answer(body, status=201)
    set_cookie(response, request, sid)
    return response


async def whoami(request: web.Request) -> web.Response:
    """The caller; with the console's cookie also its CSRF token (a reloaded page asks)."""
    session = request.get(SESSION)  # set by the middleware when the cookie authenticated
    csrf = session.csrf if session is not None else None
    return _answer(WhoAmI(principal=PrincipalOut.of(request[PRINCIPAL]), csrf_token=csrf))


async def session_status(request: web.Request) -> web.Response:
    """200 either way: the cookie's principal and CSRF token, or ``signed_in: false`` (no
    cookie, an ended session, a revoked token). Only the cookie is read: a bearer token is
    checked where it is used, under the sign-in throttle."""
    ctx = request.app[ADMIN_CONTEXT]
    found = await cookie_session(ctx.principals, ctx.sessions, request)
    if found is None:
        return _answer(SessionStatus(signed_in=False))
    principal, session = found
    out = SessionStatus(
        signed_in=True, principal=PrincipalOut.of(principal), csrf_token=session.csrf
    )
    return _answer(out)


async def sign_out(request: web.Request) -> web.Response:
    sid = request.cookies.get(COOKIE)
    if sid:
        try:
            await request.app[ADMIN_CONTEXT].sessions.close(sid)
        except SessionsUnavailable as exc:  # not signed out anywhere: say so, keep the cookie
            raise _unavailable(exc) from exc
    response = _answer(SignedOut(signed_out=True))
    clear_cookie(response)
    return response


def add_session_routes(app: web.Application) -> None:
    app.router.add_routes(
        [
            web.post("/v1/session", sign_in),
            web.get("/v1/session", whoami),
            web.delete("/v1/session", sign_out),
            web.get("/v1/session/status", session_status),
        ]
    )
