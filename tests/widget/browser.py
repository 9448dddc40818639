"""Browser-test plumbing: Debian's Chromium under Playwright, a host page on another loopback
origin (with a tiny tenant backend that issues session tokens), and a scripted backend.

The scripted backend answers the widget's routes like the gateway does (same paths, same SSE
framing) with an answer fixed by the test: it exists so a test can put hostile markup in the
"model output" deterministically. Everything else runs against the real gateway.
"""

from __future__ import annotations

import html
import json
from collections.abc import AsyncIterator, Mapping, Sequence
from contextlib import asynccontextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import aiohttp
import pytest
from aiohttp import web
from playwright.async_api import Browser, Page, async_playwright

from gateway.widget.views import SCRIPT_PATH
from tests.conftest import in_ci
from tests.loopback import serve_on_loopback

CHROMIUM = Path("/usr/bin/chromium")
CHROMIUM_ARGS = ["--no-sandbox", "--disable-gpu", "--disable-background-networking"]


def require_chromium() -> None:
    """Skip without Chromium on a developer machine; in CI its absence fails the run."""
    if CHROMIUM.exists():
        return
    if in_ci():
        pytest.fail(f"{CHROMIUM} is missing (CI=true: .ci/run installs it with apt)")
    pytest.skip(f"{CHROMIUM} is missing")


@asynccontextmanager
async def chromium() -> AsyncIterator[Browser]:
    async with async_playwright() as pw:
        browser = await pw.chromium.launch(
            executable_path=str(CHROMIUM), headless=True, args=CHROMIUM_ARGS
        )
        try:
            yield browser
        finally:
            await browser.close()


PAGE = """<!doctype html><html lang="en"><head><meta charset="utf-8">
<title>host page</title>
<style>* {{ color: red !important; font-size: 40px !important; }}
button {{ display: none; }}</style>
</head><body><h1>A host page</h1>
<script src="{src}" {attrs} defer></script></body></html>"""


def page_html(src: str, data: Mapping[str, str]) -> str:
    attrs = " ".join(f'data-{k}="{html.escape(v)}"' for k, v in data.items())
    return PAGE.format(src=html.escape(src), attrs=attrs)


@dataclass
class HostSite:
    """The embedding site: /page renders the embed tag; /session/{name} is the tenant's own
    backend, which asks the gateway for a session token with its server key."""

    gateway_url: str
    origin: str = ""
    sessions: dict[str, tuple[str, int]] = field(default_factory=dict)  # name -> key, ttl
    session_calls: dict[str, int] = field(default_factory=dict)

    def url(self, key: str, src: str | None = None, **data: str) -> str:
        params = {"key": key, "src": src or f"{self.gateway_url}/widget/v1/kvgate-chat.js", **data}
        query = "&".join(f"{k}={aiohttp.helpers.quote(v, safe='')}" for k, v in params.items())
        return f"{self.origin}/page?{query}"

    async def page(self, request: web.Request) -> web.Response:
        q = dict(request.query)
        src = q.pop("src")
        headers = {}
        if q.pop("csp", None):  # a strict policy: what docs/widget.md says the widget needs
            gw = self.gateway_url
            headers["Content-Security-Policy"] = (
                f"default-src 'none'; script-src {gw}; connect-src {gw}; style-src 'none'; "
                "require-trusted-types-for 'script'"
            )
        return web.Response(text=page_html(src, q), content_type="text/html", headers=headers)

    async def session(self, request: web.Request) -> web.Response:
        name = request.match_info["name"]
        server_key, ttl = self.sessions[name]
        self.session_calls[name] = self.session_calls.get(name, 0) + 1
        body = {"end_user_id": f"visitor-{name}", "origin": self.origin, "ttl_s": ttl}
        headers = {"Authorization": f"Bearer {server_key}"}
        async with aiohttp.ClientSession() as http:
            url = f"{self.gateway_url}/v1/widget/sessions"
            async with http.post(url, json=body, headers=headers) as resp:
                return web.json_response(await resp.json(), status=resp.status)

    def app(self) -> web.Application:
        app = web.Application()
        app.router.add_get("/page", self.page)
        app.router.add_post("/session/{name}", self.session)
        return app


@asynccontextmanager
async def host_site(gateway_url: str) -> AsyncIterator[HostSite]:
    site = HostSite(gateway_url)
    async with serve_on_loopback(site.app()) as (host, port):
        site.origin = f"http://{host}:{port}"
        yield site


CORS = {
    "Access-Control-Allow-Origin": "*",
    "Access-Control-Allow-Headers": "authorization, content-type",
    "Access-Control-Allow-Methods": "GET, POST, OPTIONS",
}


def scripted_backend(chunks: Sequence[str], *, fail_first: int = 0) -> web.Application:
    """The gateway's widget routes with a fixed streamed answer (``chunks``, one event each);
    the first ``fail_first`` chat requests get a 500 (an OpenAI-shaped error) instead."""
    failures = [fail_first]

    async def script(request: web.Request) -> web.Response:
        return web.Response(
            body=SCRIPT_PATH.read_bytes(), content_type="application/javascript", headers=CORS
        )

    async def config(request: web.Request) -> web.Response:
        body = {"title": None, "greeting": None, "accent": None, "require_session": False}
        return web.json_response({**body, "model": "scripted"}, headers=CORS)

    async def preflight(request: web.Request) -> web.Response:
        return web.Response(status=204, headers=CORS)

    async def chat(request: web.Request) -> web.StreamResponse:
        if failures[0] > 0:
            failures[0] -= 1
            error = {"message": "internal server error", "type": "internal_error"}
            return web.json_response({"error": error}, status=500, headers=CORS)
        resp = web.StreamResponse(headers={**CORS, "Content-Type": "text/event-stream"})
        await resp.prepare(request)
        for text in chunks:
            event = {"choices": [{"index": 0, "delta": {"content": text}, "finish_reason": None}]}
            await resp.write(f"data: {json.dumps(event)}\n\n".encode())
        usage = {"prompt_tokens": 3, "completion_tokens": len(chunks), "total_tokens": 3}
        await resp.write(f"data: {json.dumps({'choices': [], 'usage': usage})}\n\n".encode())
        await resp.write(b"data: [DONE]\n\n")
        return resp

    app = web.Application()
    app.router.add_get("/widget/v1/kvgate-chat.js", script)
    app.router.add_get("/widget/v1/config", config)
    app.router.add_route("OPTIONS", "/v1/chat/completions", preflight)
    app.router.add_post("/v1/chat/completions", chat)
    return app


# ---- page helpers -------------------------------------------------------------------------
HOST = "document.querySelector('kvgate-chat')"


async def wait_state(page: Page, state: str, timeout: float = 15_000) -> None:
    await page.wait_for_function(
        f"s => {HOST} && {HOST}.dataset.state === s", arg=state, timeout=timeout
    )


async def shadow(page: Page, expr: str) -> Any:
    """Evaluate ``expr`` with ``root`` = the widget's shadow root."""
    return await page.evaluate(f"() => {{ const root = {HOST}.shadowRoot; return {expr}; }}")


async def messages(page: Page) -> list[tuple[str, str]]:
    found = await shadow(
        page,
        "[...root.querySelectorAll('.msg')].map(m => [m.classList[1], m.textContent])",
    )
    return [(role, text) for role, text in found]


def usage_log_script() -> str:
    """Collects every kvgate:usage event in ``window.__usage``."""
    return (
        f"() => {{ window.__usage = []; {HOST}.addEventListener('kvgate:usage', "
        "e => window.__usage.push(e.detail)); }"
    )
