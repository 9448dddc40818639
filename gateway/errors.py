"""One error policy for HTTP: every failure a client can cause becomes an OpenAI-shaped JSON error.

Domain exceptions (tenants, engine) are mapped here by class; views raise them or ``ApiError``.
Nothing a client sends produces a 500: unexpected exceptions are logged and answered as 500
``internal_error`` without details.
"""

from __future__ import annotations

import json
from collections.abc import Awaitable, Callable

import structlog
from aiohttp import web

log = structlog.get_logger(__name__)

Handler = Callable[[web.Request], Awaitable[web.StreamResponse]]


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


def register_error(exc: type[BaseException], status: int, type_: str, code: str | None) -> None:
    _DOMAIN_ERRORS[exc] = (status, type_, code)


def to_api_error(exc: BaseException) -> ApiError | None:
    for cls in type(exc).__mro__:
        mapped = _DOMAIN_ERRORS.get(cls)
        if mapped is not None:
            status, type_, code = mapped
            param = getattr(exc, "param", None)
            return ApiError(status, str(exc), type_=type_, code=code, param=param)
    return None


def error_response(err: ApiError) -> web.Response:
    return web.json_response(err.body(), status=err.status, headers=err.headers)


_HTTP_TYPES = {401: "authentication_error", 403: "permission_error", 404: "not_found_error"}


@web.middleware
async def error_middleware(request: web.Request, handler: Handler) -> web.StreamResponse:
    try:
        return await handler(request)
    except ApiError as err:
        return error_response(err)
    except web.HTTPException as exc:
        if exc.status < 400:
            raise
        type_ = _HTTP_TYPES.get(exc.status, "invalid_request_error")
        return error_response(ApiError(exc.status, exc.reason or "error", type_=type_))
    except json.JSONDecodeError as exc:
        return error_response(ApiError(400, f"request body is not valid JSON: {exc.msg}"))
    except Exception as exc:
        err = to_api_error(exc)
        if err is not None:
            return error_response(err)
        log.exception("unhandled_error", path=request.path)
        return error_response(ApiError(500, "internal server error", type_="internal_error"))
