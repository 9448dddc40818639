"""Admin bearer-token check. The token is known only by its SHA-256; comparison is constant-time."""

from __future__ import annotations

import hashlib
import hmac

from aiohttp import web

from gateway.errors import ApiError, Handler


def _unauthorized(message: str) -> ApiError:
    return ApiError(
        401,
        message,
        type_="authentication_error",
        code="invalid_admin_token",
        headers={"WWW-Authenticate": 'Bearer realm="kvgate-admin"'},
    )


def admin_auth_middleware(token_sha256: str | None) -> web.Middleware:
    expected = token_sha256.encode() if token_sha256 else None

    @web.middleware
    async def middleware(request: web.Request, handler: Handler) -> web.StreamResponse:
        if expected is None:
            raise _unauthorized("admin API disabled: no admin token is configured")
        scheme, _, token = request.headers.get("Authorization", "").partition(" ")
        if scheme.lower() != "bearer" or not token.strip():
            raise _unauthorized("missing admin bearer token")
        presented = hashlib.sha256(token.strip().encode()).hexdigest().encode()
        if not hmac.compare_digest(presented, expected):
            raise _unauthorized("invalid admin token")
        return await handler(request)

    return middleware
