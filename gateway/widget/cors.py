"""CORS for browser callers (the widget): preflight on every public route, exposed headers.

Chat and model requests are readable only by the checked origin of a widget key or session
token (``CORS_ORIGIN``, set by authentication); the widget's own assets and public config are
readable by any page (``*``): they hold nothing secret.
"""

from __future__ import annotations

from aiohttp import web

from gateway.access.auth import CORS_ORIGIN
from gateway.errors import ApiError

PUBLIC_PREFIX = "/widget/v1/"
# What a browser script may read of a response besides the CORS-safelisted headers.
EXPOSE_HEADERS = ", ".join(
    (
        "Retry-After",
        "x-request-id",
        *(
            f"x-ratelimit-{what}-{dim}"
            for dim in ("requests", "tokens")
            for what in ("limit", "remaining", "reset")
        ),
        "x-ratelimit-scope",
    )
)


async def cors_headers(request: web.Request, response: web.StreamResponse) -> None:
    """``on_response_prepare`` hook: CORS headers for widget requests and public assets."""
    origin = request.get(CORS_ORIGIN)
    if origin is not None:
        response.headers["Access-Control-Allow-Origin"] = origin
        response.headers["Access-Control-Expose-Headers"] = EXPOSE_HEADERS
        response.headers["Vary"] = "Origin"
    elif request.path.startswith(PUBLIC_PREFIX):
        response.headers.setdefault("Access-Control-Allow-Origin", "*")


async def preflight(request: web.Request) -> web.Response:
    """CORS preflight; the real request is checked against the key's (or token's) origins."""
    origin = request.headers.get("Origin")
    if origin is None:
        raise ApiError(400, "CORS preflight without Origin")
    return web.Response(
        status=204,
        headers={
            "Access-Control-Allow-Origin": origin,
            "Access-Control-Allow-Methods": "GET, POST, DELETE, OPTIONS",
            "Access-Control-Allow-Headers": "authorization, content-type, x-kvgate-conversation",
            "Access-Control-Max-Age": "600",
            "Vary": "Origin",
        },
    )


def add_preflight(app: web.Application, *paths: str) -> None:
    for path in paths:
        app.router.add_route("OPTIONS", path, preflight)
