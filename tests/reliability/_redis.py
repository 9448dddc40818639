"""Redis fault injection for the reliability suite: a private ``redis-server`` that a test may
kill and restart (tests/gateway/redis_server.py), and a proxy in front of it that delays every
reply by ``delay_s`` (a slow or stalled Redis: replies that come after the client's timeout)."""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import Callable, Coroutine

from tests.gateway.redis_server import RedisServer, free_port

__all__ = ["DelayProxy", "RedisServer"]


class DelayProxy:
    """Forwards loopback TCP to ``upstream_port``; data from the server reaches the client
    ``delay_s`` after it arrived (in order). Requests pass at once, so Redis runs a command
    when it is sent, and the client sees the answer late."""

    def __init__(self, upstream_port: int) -> None:
        self.upstream_port = upstream_port
        self.port = free_port()
        self.delay_s = 0.0
        self._server: asyncio.Server | None = None
        self._tasks: set[asyncio.Task[None]] = set()

    @property
    def url(self) -> str:
        return f"redis://127.0.0.1:{self.port}/0"

    async def start(self) -> None:
        self._server = await asyncio.start_server(self._accept, "127.0.0.1", self.port)

    async def close(self) -> None:
        if self._server is not None:
            self._server.close()
        for task in list(self._tasks):
            task.cancel()
        for task in list(self._tasks):
            with contextlib.suppress(asyncio.CancelledError, Exception):
                await task

    def _spawn(self, coro: Coroutine[None, None, None]) -> None:
        task = asyncio.ensure_future(coro)
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)

    async def _accept(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        try:
            up_reader, up_writer = await asyncio.open_connection("127.0.0.1", self.upstream_port)
        except OSError:
            writer.close()
            return
        self._spawn(_pump(reader, up_writer, lambda: 0.0))
        self._spawn(_pump(up_reader, writer, lambda: self.delay_s))


async def _pump(
    reader: asyncio.StreamReader, writer: asyncio.StreamWriter, delay: Callable[[], float]
) -> None:
    """Copy ``reader`` to ``writer``, each chunk held back by ``delay()`` seconds."""
    queue: asyncio.Queue[tuple[float, bytes]] = asyncio.Queue()

    async def deliver() -> None:
        while True:
            due, data = await queue.get()
            if not data:
                break
            await asyncio.sleep(max(0.0, due - time.monotonic()))
            writer.write(data)
            await writer.drain()

    sender = asyncio.ensure_future(deliver())
    try:
        while data := await reader.read(65536):
            queue.put_nowait((time.monotonic() + delay(), data))
        queue.put_nowait((0.0, b""))
        await sender
    except (ConnectionError, asyncio.CancelledError):
        pass
    finally:
        sender.cancel()
        writer.close()
