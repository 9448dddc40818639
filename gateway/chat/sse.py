"""Server-sent events framing: ``data: {json}`` blank line ... ``data: [DONE]``."""

from __future__ import annotations

import json
from typing import Any

from aiohttp import web

DONE = b"data: [DONE]\n\n"


async def open_stream(request: web.Request, headers: dict[str, str]) -> web.StreamResponse:
    resp = web.StreamResponse(
        status=200,
        headers={
            "Content-Type": "text/event-stream; charset=utf-8",
            "Cache-Control": "no-cache",
            "X-Accel-Buffering": "no",  # proxies must not buffer token-by-token output
            **headers,
        },
    )
    await resp.prepare(request)
    return resp


def encode_event(obj: dict[str, Any]) -> bytes:
    return b"data: " + json.dumps(obj, separators=(",", ":")).encode() + b"\n\n"


async def send_event(resp: web.StreamResponse, obj: dict[str, Any]) -> None:
    await resp.write(encode_event(obj))


async def send_done(resp: web.StreamResponse) -> None:
    await resp.write(DONE)
