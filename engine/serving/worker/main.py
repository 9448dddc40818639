"""Run one engine worker: load the model, serve the probes and the transport until SIGTERM.

``serve_worker`` prints one line once it listens (``kvgate worker: listening on URL``); a parent
process that started it reads that line to learn the port. With ``unix_path`` the worker also
listens on that Unix domain socket (owner-only), bound before that line: the local worker that
``kvgate serve`` starts takes its calls there, skipping the loopback TCP stack. With
``exit_with_stdin`` the worker also stops when its standard input closes, so a worker started by
``kvgate serve`` never outlives the gateway that started it, however that one ended.
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

from engine.remote.messages import READY_PREFIX
from engine.serving.worker.events import KvEventHub
from engine.serving.worker.server import create_worker_app


def build_app(
    model_dir: str | Path, token: str, worker_id: str, **overrides: Any
) -> web.Application:
    from engine.serving.async_engine import AsyncEngine

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
    """The probes and the message transport on ``host:port`` and, with ``unix_path``, on that
    Unix domain socket too (created owner-only)."""
    runner = web.AppRunner(app, handler_cancellation=True, access_log=None)
    await runner.setup()
    try:
        site = web.TCPSite(runner, host, port, reuse_address=True)
        await site.start()
        bound_host, bound_port = runner.addresses[0][:2]
        if unix_path is not None:
            old = os.umask(0o177)  # the socket is created owner-only (no window of wider mode)
            try:
                await web.UnixSite(runner, unix_path).start()
            finally:
                os.umask(old)
        print(f"{READY_PREFIX}http://{bound_host}:{bound_port}", flush=True)
        await _wait_for_stop(exit_with_stdin)
    finally:
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
