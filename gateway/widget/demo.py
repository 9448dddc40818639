"""``GET /widget/demo``: a page with the widget on it, chatting with the served model.

Served only when ``KVGATE_WIDGET_DEMO`` is on (``auto``: in the embedded default only). On the
first visit from an origin it creates the tenant ``widget-demo`` (if missing) and a widget key
bound to that origin (the page's own), and remembers the key in ``VAR_DIR/widget-demo-keys.json``
(mode 0600): the key is shown to the browser anyway, but the store keeps only its hash. At most
``MAX_ORIGINS`` origins get a key.
"""

from __future__ import annotations

import asyncio
import html
import json
import os
from pathlib import Path

from aiohttp import web

from gateway.context import STATE
from gateway.errors import ApiError
from tenants.errors import TenantExists
from tenants.schemas import KeyCreate, TenantCreate, parse

DEMO_TENANT = "widget-demo"
DEMO_PROMPT = "You are the kvgate demo assistant. Answer briefly and kindly."
KEYS_FILE = "widget-demo-keys.json"
# The page's origin comes from the Host header: a client could ask for keys for any number of
# made-up origins. Past this many the demo refuses new ones instead of filling the key table.
MAX_ORIGINS = 16
ACTOR = "widget-demo"

PAGE = """<!doctype html>
<html lang="en">
<head>
<meta charset="utf-8">
<meta name="viewport" content="width=device-width, initial-scale=1">
<title>kvgate widget demo</title>
<style>
  body {{ font: 16px/1.5 system-ui, sans-serif; max-width: 42rem; margin: 3rem auto;
         padding: 0 1rem; color: #1d2330; }}
  code {{ background: #eef1f6; padding: .1rem .3rem; border-radius: 4px; }}
  @media (prefers-color-scheme: dark) {{ body {{ background: #14171f; color: #e6e9ef; }}
    code {{ background: #262b38; }} }}
</style>
</head>
<body>
<h1>kvgate chat widget</h1>
<p>This page embeds the widget with one tag. It talks to <code>{model}</code> on this gateway
through the demo tenant <code>{tenant}</code> and a widget key bound to <code>{origin}</code>.</p>
<pre><code>&lt;script src="{origin}/widget/v1/kvgate-chat.js"
        data-key="…" defer&gt;&lt;/script&gt;</code></pre>
<script src="/widget/v1/kvgate-chat.js" data-key="{key}" data-title="kvgate demo"
        data-greeting="Hello! Ask me anything." data-open="true" defer></script>
</body>
</html>
"""


class DemoKeys:
    """The demo tenant and one widget key per page origin (created once, then remembered)."""

    def __init__(self, var_dir: Path) -> None:
        self._path = var_dir / KEYS_FILE
        self._lock = asyncio.Lock()

    def _load(self) -> dict[str, str]:
        try:
            data = json.loads(self._path.read_text())
        except (OSError, ValueError):
            return {}
        return {str(k): str(v) for k, v in data.items()} if isinstance(data, dict) else {}

    def _save(self, keys: dict[str, str]) -> None:
        self._path.parent.mkdir(parents=True, exist_ok=True)
        tmp = self._path.with_suffix(".tmp")
        fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
        with os.fdopen(fd, "w") as fh:
            json.dump(keys, fh)
        tmp.replace(self._path)

    async def key_for(self, request: web.Request, origin: str) -> str:
        state = request.app[STATE]
        async with self._lock:
            keys = self._load()
            known = keys.get(origin)
            if known is not None and await state.keys.identity(known) is not None:
                return known
            if known is None and len(keys) >= MAX_ORIGINS:
                raise ApiError(
                    403,
                    f"the widget demo serves at most {MAX_ORIGINS} origins",
                    type_="permission_error",
                    code="demo_origin_limit",
                )
            try:
                create = TenantCreate(
                    id=DEMO_TENANT,
                    name="Widget demo",
                    system_prompt=DEMO_PROMPT,
                    allow_client_system=False,
                )
                await state.store.create_tenant(create, actor=ACTOR)
            except TenantExists:
                pass
            # parse: a Host that makes no valid origin is a 422, like any bad field
            data = parse(KeyCreate, {"kind": "widget", "allowed_origins": [origin]})
            created = await state.store.create_key(DEMO_TENANT, data, actor=ACTOR)
            keys[origin] = created.key
            self._save(keys)
            return created.key


DEMO_KEYS = web.AppKey("widget_demo_keys", DemoKeys)


async def demo_page(request: web.Request) -> web.Response:
    origin = f"{request.scheme}://{request.host}"
    key = await request.app[DEMO_KEYS].key_for(request, origin)
    body = PAGE.format(
        model=html.escape(request.app[STATE].model_name),
        tenant=DEMO_TENANT,
        origin=html.escape(origin),
        key=html.escape(key),
    )
    return web.Response(
        text=body,
        content_type="text/html",
        headers={"Cache-Control": "no-store", "Referrer-Policy": "no-referrer"},
    )
