"""A real webhook receiver on loopback for the tool tests: verifies signatures as a tenant's
endpoint would (gateway/chat/tools/run/webhook.py's ``verify``) and answers per path."""

from __future__ import annotations

import asyncio
import json
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from dataclasses import dataclass, field
from typing import Any

from aiohttp import web

from gateway.chat.tools.run.webhook import verify


@dataclass
class Received:
    path: str
    body: dict[str, Any]
    verified: bool
    cookies: dict[str, str]


@dataclass
class Receiver:
    url: str
    secret: str = ""
    calls: list[Received] = field(default_factory=list)

    def paths(self) -> list[str]:
        return [c.path for c in self.calls]


def _app(receiver: Receiver) -> web.Application:
    async def record(request: web.Request) -> Received:
        raw = await request.read()
        got = Received(
            request.path,
            json.loads(raw),
            verify(receiver.secret, raw, request.headers),
            dict(request.cookies),
        )
        receiver.calls.append(got)
        return got

    async def ok(request: web.Request) -> web.Response:
        got = await record(request)
        args = got.body["arguments"]
        resp = web.json_response({"status": "shipped", "echo": args, "signed": got.verified})
        resp.set_cookie("session", "tenant-a-secret")
        return resp

    async def slow(request: web.Request) -> web.Response:
        await record(request)
        await asyncio.sleep(3)
        return web.json_response({"late": True})

    async def pause(request: web.Request) -> web.Response:
        await asyncio.sleep(1.0)  # long enough for a status line to be seen, within deadlines
        return await ok(request)

    async def fail(request: web.Request) -> web.Response:
        await record(request)
        return web.json_response({"error": "boom"}, status=500)

    async def huge(request: web.Request) -> web.StreamResponse:
        await record(request)
        resp = web.StreamResponse(headers={"Content-Type": "application/json"})
        await resp.prepare(request)  # chunked: no Content-Length to refuse it by
        chunk = b" " * (1 << 20)
        for _ in range(10):
            await resp.write(chunk)
        await resp.write_eof()
        return resp

    async def reject(request: web.Request) -> web.Response:
        await record(request)  # what a tool answers arguments it cannot use
        return web.json_response({"error": "order_id must be a number"}, status=422)

    async def big(request: web.Request) -> web.Response:
        await record(request)  # ~40 KB of JSON: within the answer cap, past a 4k context
        return web.json_response({"notes": "order details " * 3000})

    async def text(request: web.Request) -> web.Response:
        await record(request)
        return web.Response(text="not json at all")

    async def redirect(request: web.Request) -> web.Response:
        await record(request)
        raise web.HTTPFound("/ok")

    app = web.Application()
    for path, handler in (
        ("/ok", ok),
        ("/slow", slow),
        ("/pause", pause),
        ("/fail", fail),
        ("/reject", reject),
        ("/huge", huge),
        ("/big", big),
        ("/text", text),
        ("/redirect", redirect),
    ):
        app.router.add_post(path, handler)
    return app


@asynccontextmanager
async def webhook_receiver(secret: str = "") -> AsyncIterator[Receiver]:
    receiver = Receiver("", secret)
    runner = web.AppRunner(_app(receiver), handler_cancellation=True)
    await runner.setup()
    site = web.TCPSite(runner, "127.0.0.1", 0)
    await site.start()
    host, port = runner.addresses[0][:2]
    receiver.url = f"http://{host}:{port}"
    try:
        yield receiver
    finally:
        await runner.cleanup()
