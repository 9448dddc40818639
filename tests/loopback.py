"""An aiohttp app served on a free loopback port for the length of a ``with`` block."""

from __future__ import annotations

from collections.abc import AsyncIterator
from contextlib import asynccontextmanager

from aiohttp import web


@asynccontextmanager
async def serve_on_loopback(app: web.Application) -> AsyncIterator[tuple[str, int]]:
    """Yields (host, port); the app is cleaned up on exit."""
    runner = web.AppRunner(app)
    await runner.setup()
    try:
        site = web.TCPSite(runner, "127.0.0.1", 0)
        await site.start()
        host, port = runner.addresses[0][:2]
        yield host, port
    finally:
        await runner.cleanup()
