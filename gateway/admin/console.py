"""The admin console's files at ``/admin/ui/`` (public: the API behind them is not);
``/admin/ui`` redirects there (308: the page's relative URLs resolve under the slash).

Plain HTML, CSS and ES modules from ``gateway/admin/ui`` (no build step, no CDN), read once
when the routes are added and answered from memory; any other name is a 404. Every answer
carries a strict Content-Security-Policy: nothing but this origin's own files, no inline
script or style, no framing.
"""

from __future__ import annotations

from pathlib import Path

from aiohttp import web

from gateway.errors import ApiError

UI_DIR = Path(__file__).parent / "ui"
CSP = (
    "default-src 'self'; script-src 'self'; style-src 'self'; img-src 'self' data:; "
    "connect-src 'self'; object-src 'none'; base-uri 'none'; form-action 'self'; "
    "frame-ancestors 'none'"
)
SECURITY_HEADERS = {
    "Content-Security-Policy": CSP,
    "X-Content-Type-Options": "nosniff",
    "X-Frame-Options": "DENY",
    "Referrer-Policy": "no-referrer",
    "Cache-Control": "no-cache",
}
TYPES = {
    ".html": "text/html",
    ".css": "text/css",
    ".js": "text/javascript",
    ".svg": "image/svg+xml",
}
UI = web.AppKey("console_files", dict)


def load_files(root: Path = UI_DIR) -> dict[str, tuple[bytes, str]]:
    """Relative path -> (bytes, content type) of every servable file under ``root``."""
    files: dict[str, tuple[bytes, str]] = {}
    for path in sorted(root.rglob("*")):
        kind = TYPES.get(path.suffix)
        if path.is_file() and kind is not None:
            files[path.relative_to(root).as_posix()] = (path.read_bytes(), kind)
    return files


def _answer(files: dict[str, tuple[bytes, str]], name: str) -> web.Response:
    found = files.get(name)
    if found is None:
        raise ApiError(404, "no such console file", type_="not_found_error", code="not_found")
    body, kind = found
    return web.Response(body=body, content_type=kind, charset="utf-8", headers=SECURITY_HEADERS)


async def to_index(request: web.Request) -> web.Response:
    """``/admin/ui`` -> ``/admin/ui/`` (the query kept)."""
    query = request.query_string
    target = f"{request.path}/" + (f"?{query}" if query else "")
    return web.Response(status=308, headers={**SECURITY_HEADERS, "Location": target}, text="")


async def index(request: web.Request) -> web.Response:
    return _answer(request.app[UI], "index.html")


async def asset(request: web.Request) -> web.Response:
    return _answer(request.app[UI], request.match_info["path"])


def add_console_routes(app: web.Application) -> None:
    app[UI] = load_files()
    app.router.add_get("/ui", to_index)
    app.router.add_get("/ui/", index)
    app.router.add_get("/ui/{path:.+}", asset)
