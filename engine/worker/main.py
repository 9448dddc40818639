"""Run one engine worker: load the model, serve the internal API until SIGTERM / SIGINT.

``serve_worker`` prints one line once it listens (``kvgate worker: listening on URL``); a parent
process that started it reads that line to learn the port. With ``unix_path`` it also serves on
a Unix domain socket there (owner-only), bound before that line: the local worker that
``kvgate serve`` starts takes its generate streams there, skipping the loopback TCP stack. With
``exit_with_stdin`` the worker
also stops when its standard input closes, so a worker started by ``kvgate serve`` never outlives
the gateway that started it, however that one ended.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import signal
import threading
from pathlib import Path
from typing import Any

from aiohttp import web

from engine.worker.events import KvEventHub
from engine.worker.fastpath import GenerateConnections
from engine.worker.server import WORKER, create_worker_app

READY_PREFIX = "kvgate worker: listening on "


def build_app(
    model_dir: str | Path, token: str, worker_id: str, **overrides: Any
) -> web.Application:
    from engine.async_engine import AsyncEngine

    events = KvEventHub()
    engine = AsyncEngine.from_pretrained(model_dir, listener=events, **overrides)
    return create_worker_app(engine, events, token, worker_id)


async def serve_worker(
    app: web.Application,
    host: str,
    port: int,
    *,
    exit_with_stdin: bool = False,
    unix_path: str | None = None,
) -> None:
    runner = web.AppRunner(app, handler_cancellation=True, access_log=None)
    await runner.setup()
    assert runner.server is not None
    # generate connections on the fast path, every other request handed to aiohttp
    factory = GenerateConnections(app[WORKER], runner.server)
    loop = asyncio.get_running_loop()
    servers: list[asyncio.AbstractServer] = []
    try:
        servers.append(await loop.create_server(factory, host, port, reuse_address=True))
        bound_host, bound_port = servers[0].sockets[0].getsockname()[:2]
        if unix_path is not None:
            old = os.umask(0o177)  # the socket is created owner-only (no window of wider mode)
            try:
                servers.append(await loop.create_unix_server(factory, unix_path))
            finally:
                os.umask(old)
        print(f"{READY_PREFIX}http://{bound_host}:{bound_port}", flush=True)
        await _wait_for_stop(exit_with_stdin)
    finally:
        for server in servers:
            server.close()
        await factory.close()
        await runner.cleanup()


async def _wait_for_stop(exit_with_stdin: bool) -> None:
    loop = asyncio.get_running_loop()
    stop = asyncio.Event()
    for sig in (signal.SIGTERM, signal.SIGINT):
        with contextlib.suppress(NotImplementedError, RuntimeError):
            loop.add_signal_handler(sig, stop.set)
    if exit_with_stdin:
        threading.Thread(
            target=_read_to_eof, args=(loop, stop), name="kvgate-stdin", daemon=True
        ).start()
    await stop.wait()


def _read_to_eof(loop: asyncio.AbstractEventLoop, stop: asyncio.Event) -> None:
    with contextlib.suppress(OSError):  # raw reads: no buffered-reader lock held at exit
        while os.read(0, 4096):
            pass
    with contextlib.suppress(RuntimeError):
        loop.call_soon_threadsafe(stop.set)
