"""``GET /``: where a fresh gateway's pages are; ``GET /favicon.ico``: its icon.

The page links the widget demo (where this gateway serves it), the admin console and the API
reference (``/openapi.json``), and names the guides; it is static (nothing read per request,
no tenant, no model name: ``/v1/models`` is for keys). Its only style is inline, allowed by the
CSP through its hash. The icon is a file of the package (``gateway/static/favicon.ico``, a chat
bubble on the console's accent), answered with an ETag and a day's cache, so browsers stop
asking on every page.
"""

from __future__ import annotations

import base64
import hashlib
from pathlib import Path

from aiohttp import web

from gateway.settings import Settings
from gateway.widget.routes import DEMO_ROUTE, SCRIPT_ROUTE
from gateway.widget.views import Asset

ICON_PATH = Path(__file__).parent / "static" / "favicon.ico"
CONSOLE = "/admin/ui/"
API_REFERENCE = "/openapi.json"
STYLE = (
    "body{font:16px/1.5 system-ui,sans-serif;max-width:40rem;margin:3rem auto;padding:0 1rem;"
    "color:#1b1f24}a{color:#1f5fbf}code{background:#eef1f6;padding:0 .3rem;border-radius:4px}"
    "@media (prefers-color-scheme:dark){body{background:#14171f;color:#e6e9ef}a{color:#8ab4f8}"
    "code{background:#262b38}}"
)
_STYLE_HASH = base64.b64encode(hashlib.sha256(STYLE.encode()).digest()).decode()
HEADERS = {
    "Content-Security-Policy": (
        f"default-src 'none'; style-src 'sha256-{_STYLE_HASH}'; img-src 'self'; "
        "base-uri 'none'; form-action 'none'; frame-ancestors 'none'"
    ),
    "X-Content-Type-Options": "nosniff",
    "Referrer-Policy": "no-referrer",
    "Cache-Control": "no-cache",
}


def page(widget_demo: bool) -> str:
    demo = (
        f'<li><a href="{DEMO_ROUTE}">Widget demo</a>: chat with the served model through the '
        "embeddable widget</li>"
        if widget_demo
        else "<li>Widget demo: off on this gateway (<code>KVGATE_WIDGET_DEMO</code>)</li>"
    )
    return f"""<!doctype html>
<html lang="en">
<head>
<meta charset="utf-8">
<meta name="viewport" content="width=device-width, initial-scale=1">
<title>kvgate</title>
<link rel="icon" href="/favicon.ico">
<style>{STYLE}</style>
</head>
<body>
<h1>kvgate</h1>
<p>A multi-tenant chat gateway with its own inference engine: the OpenAI chat API at
<code>/v1/chat/completions</code> (a tenant key as bearer), the admin API at
<code>/admin/v1</code>.</p>
<ul>
{demo}
<li><a href="{CONSOLE}">Admin console</a>: tenants, prompts, keys, limits, usage (sign in with
an admin token)</li>
<li><a href="{API_REFERENCE}">API reference</a>: every route as OpenAPI 3.1</li>
<li>The widget on a page:
<code>&lt;script src="{SCRIPT_ROUTE}" data-key="…" defer&gt;&lt;/script&gt;</code></li>
</ul>
<p>The guides are the <code>docs/</code> of the kvgate source: <code>api.md</code>,
<code>operations.md</code>, <code>widget.md</code>, <code>tools.md</code>.</p>
</body>
</html>
"""


def register_home(app: web.Application, settings: Settings) -> None:
    body = page(settings.widget.demo).encode()

    async def home(_request: web.Request) -> web.Response:
        return web.Response(body=body, content_type="text/html", charset="utf-8", headers=HEADERS)

    icon = Asset.load(ICON_PATH, "image/vnd.microsoft.icon")
    app.router.add_get("/", home)
    app.router.add_get("/favicon.ico", icon.serve)
