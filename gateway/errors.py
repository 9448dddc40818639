"""One error policy for HTTP: every failure a client can cause becomes an OpenAI-shaped JSON error.

Domain exceptions (tenants, engine) are mapped here by class; views raise them or ``ApiError``.
Nothing a client sends produces a 500: unexpected exceptions are logged and answered as 500
``internal_error`` without details.

Every refusal (an error answer) carries ``x-request-id`` and is logged once, as one
``request_refused`` line: request id, status, reason (the error code), route template and tenant
when known. Never a header value, key, body or message text: error messages may quote what the
client sent, so they stay in the answer to that client and out of the logs. Unexpected exceptions
are logged by type and stack frames only, for the same reason.
"""

from __future__ import annotations

import json
import traceback
import uuid
from collections.abc import Awaitable, Callable
from typing import Protocol

import structlog
from aiohttp import web

log = structlog.get_logger(__name__)

# Set by the views as soon as known; read when a refusal is answered and logged.
REQUEST_ID = web.RequestKey("request_id", str)
TENANT = web.RequestKey("tenant", str)

Handler = Callable[[web.Request], Awaitable[web.StreamResponse]]


class Middleware(Protocol):
    """What ``web.Application(middlewares=...)`` takes: aiohttp calls it by parameter name, so a
    positional ``Callable`` does not fit (its own Protocol lives in the undocumented typedefs)."""

    def __call__(self, request: web.Request, handler: Handler) -> Awaitable[web.StreamResponse]: ...


class ApiError(Exception):
    """An error with an HTTP status and an OpenAI error body."""

    def __init__(
        self,
        status: int,
        message: str,
        *,
        type_: str = "invalid_request_error",
        code: str | None = None,
        param: str | None = None,
        headers: dict[str, str] | None = None,
    ) -> None:
        super().__init__(message)
        self.status = status
        self.message = message
        self.type = type_
        self.code = code
        self.param = param
        self.headers = headers or {}

    def body(self) -> dict[str, object]:
        return {
            "error": {
                "message": self.message,
                "type": self.type,
                "param": self.param,
                "code": self.code,
            }
        }


# Domain exception class -> (status, type, code). Subclasses match their nearest mapped base.
# Packages register their exceptions with ``register_error`` from the gateway side.
_DOMAIN_ERRORS: dict[type[BaseException], tuple[int, str, str | None]] = {}
_DOMAIN_HEADERS: dict[type[BaseException], dict[str, str]] = {}


def register_error(
    exc: type[BaseException],
    status: int,
    type_: str,
    code: str | None,
    headers: dict[str, str] | None = None,
) -> None:
    _DOMAIN_ERRORS[exc] = (status, type_, code)
    if headers:
        _DOMAIN_HEADERS[exc] = headers


def to_api_error(exc: BaseException) -> ApiError | None:
    for cls in type(exc).__mro__:
        mapped = _DOMAIN_ERRORS.get(cls)
        if mapped is not None:
            status, type_, code = mapped
            param = getattr(exc, "param", None)
            headers = dict(_DOMAIN_HEADERS.get(cls, {}))
            return ApiError(status, str(exc), type_=type_, code=code, param=param, headers=headers)
    return None


def error_response(err: ApiError) -> web.Response:
    return web.json_response(err.body(), status=err.status, headers=err.headers)


def new_request_id(prefix: str = "req-") -> str:
    return f"{prefix}{uuid.uuid4().hex}"


def request_id(request: web.BaseRequest) -> str:
    """The request's id (``x-request-id``): the one a view chose, else a new one, kept."""
    rid = request.get(REQUEST_ID)
    if rid is None:
        rid = new_request_id()
        request[REQUEST_ID] = rid
    return rid


def route_of(request: web.BaseRequest) -> str:
    """The matched route's template (``/admin/v1/tenants/{id}``), never the raw path."""
    if not isinstance(request, web.Request):  # a BaseRequest: no routing
        return "unmatched"
    try:
        resource = request.match_info.route.resource
    except (AttributeError, AssertionError):  # not routed (yet)
        return "unmatched"
    return f"{request.method} {resource.canonical}" if resource is not None else "unmatched"


def log_refusal(rid: str, status: int, reason: str, route: str, tenant: str | None = None) -> None:
    """The one log line of a refused request. Every field is chosen by the gateway."""
    fields = {"request_id": rid, "status": status, "reason": reason, "route": route}
    if tenant:
        fields["tenant"] = tenant
    (log.warning if status >= 500 else log.info)("request_refused", **fields)


def refuse(request: web.BaseRequest, err: ApiError) -> web.Response:
    """The answer to a refused request: the error body, ``x-request-id``, one log line."""
    rid = request_id(request)
    log_refusal(rid, err.status, err.code or err.type, route_of(request), request.get(TENANT))
    resp = error_response(err)
    resp.headers["x-request-id"] = rid
    if request.content.exception() is not None:
        resp.force_close()  # the body failed: the connection cannot carry another request
    return resp


def stack_summary(exc: BaseException) -> str:
    """Type and stack frames of ``exc``, without its message (which may quote client data)."""
    frames = "".join(traceback.format_tb(exc.__traceback__))
    return f"{type(exc).__module__}.{type(exc).__qualname__}\n{frames}"


_HTTP_TYPES = {401: "authentication_error", 403: "permission_error", 404: "not_found_error"}
_HTTP_CODES = {
    404: "not_found",
    405: "method_not_allowed",
    413: "request_too_large",
    415: "unsupported_media_type",
}


def body_error(content_encoding: str) -> ApiError:
    """A body aiohttp could not read. Its framing is whole (gateway/http passes on complete
    bodies only), so with a Content-Encoding aiohttp decodes it did not decode."""
    if content_encoding.strip().lower() in ("gzip", "deflate"):
        return ApiError(400, "the request body does not match its Content-Encoding",
                        code="invalid_content_encoding")  # fmt: skip
    return ApiError(400, "the request body could not be read", code="invalid_body")


def to_http_error(exc: BaseException) -> ApiError | None:
    """``exc`` as the error a client gets, or None when it is unexpected (a 500)."""
    if isinstance(exc, ApiError):
        return exc
    if isinstance(exc, web.HTTPException):
        type_ = _HTTP_TYPES.get(exc.status, "invalid_request_error")
        code = _HTTP_CODES.get(exc.status)
        return ApiError(exc.status, exc.reason or "error", type_=type_, code=code)
    if isinstance(exc, json.JSONDecodeError):
        return ApiError(400, f"request body is not valid JSON: {exc.msg}")
    return to_api_error(exc)


@web.middleware
async def error_middleware(request: web.Request, handler: Handler) -> web.StreamResponse:
    try:
        return await handler(request)
    except web.HTTPException as exc:
        if exc.status < 400:
            raise
        return refuse(request, _expected(request, exc))
    except Exception as exc:
        return refuse(request, _expected(request, exc))


def _expected(request: web.Request, exc: Exception) -> ApiError:
    if isinstance(exc, web.RequestPayloadError):
        return body_error(request.headers.get("Content-Encoding", ""))
    err = to_http_error(exc)
    if err is None:
        log.error("unhandled_error", route=route_of(request), error=stack_summary(exc))
        err = ApiError(500, "internal server error", type_="internal_error")
    return err
