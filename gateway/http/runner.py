"""The runner ``kvgate serve`` (and the tests) serve the app with: aiohttp's public
``web.AppRunner``, its ``web.Server`` called for one protocol per connection, behind the front
(front.py) on listeners of the runner's own (``listen_tcp`` / ``listen_unix``).

aiohttp calls the access logger class it is given once per request, after the response is
written: :class:`ExchangeLog` tells the connection's front (so the next request is passed on),
then writes the access line if access logging is on (redacted to its status, logs.py).

    runner = make_runner(app, header_timeout_s=10, body_timeout_s=30, shutdown_timeout=5)
    await runner.setup()
    await runner.listen_tcp("127.0.0.1", 8000)
    ...
    await runner.cleanup()  # listeners closed first, then aiohttp's graceful shutdown
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import signal
from collections.abc import Callable
from typing import Any

from aiohttp import web
from aiohttp.abc import AbstractAccessLogger

from gateway.http.front import FrontProtocol, ReadDeadlines
from gateway.http.logs import install_log_redaction
from gateway.http.transport import InnerTransport

ACCESS_LOGGER = logging.getLogger("aiohttp.access")  # where aiohttp's access lines go
_NO_ACCESS_LOG = logging.getLogger("gateway.http.no_access_log")  # access_log=None


class ExchangeLog(AbstractAccessLogger):
    """Called by aiohttp when a response is written (the end of one request's exchange)."""

    def log(self, request: web.BaseRequest, response: web.StreamResponse, time: float) -> None:
        transport = request.transport
        if isinstance(transport, InnerTransport):
            transport.front.response_done()
        if self.logger is not _NO_ACCESS_LOG and self.logger.isEnabledFor(logging.INFO):
            status = response.status
            self.logger.info("http_access status=%s", status, extra={"response_status": status})

    @property
    def enabled(self) -> bool:
        return True  # every exchange's end is needed, logged or not


class GatewayRunner:
    """A ``web.AppRunner`` whose connections go through the front."""

    def __init__(self, app: web.Application, deadlines: ReadDeadlines, **kwargs: Any) -> None:
        if "access_log_class" in kwargs:
            raise TypeError("the HTTP layer writes the access lines itself (ExchangeLog)")
        access_log = kwargs.pop("access_log", ACCESS_LOGGER) or _NO_ACCESS_LOG
        self._runner = web.AppRunner(
            app, access_log_class=ExchangeLog, access_log=access_log, **kwargs
        )
        self.deadlines = deadlines
        self._listeners: list[asyncio.Server] = []

    async def setup(self) -> None:
        install_log_redaction()
        await self._runner.setup()

    def _connection(self) -> FrontProtocol:
        server = self._runner.server
        assert server is not None, "GatewayRunner.setup() first"
        return FrontProtocol(server, self.deadlines)

    async def listen_tcp(self, host: str | None, port: int, **kwargs: Any) -> None:
        """Listen on ``host:port`` (``kwargs`` as for ``loop.create_server``: ssl, backlog...)."""
        loop = asyncio.get_running_loop()
        self._listeners.append(await loop.create_server(self._connection, host, port, **kwargs))

    async def listen_unix(self, path: str, **kwargs: Any) -> None:
        loop = asyncio.get_running_loop()
        self._listeners.append(await loop.create_unix_server(self._connection, path, **kwargs))

    @property
    def addresses(self) -> list[Any]:
        """The bound addresses (``socket.getsockname()`` of each listening socket)."""
        return [sock.getsockname() for server in self._listeners for sock in server.sockets]

    @property
    def app(self) -> web.Application:
        return self._runner.app

    async def cleanup(self) -> None:
        """Stop listening at once, then aiohttp's graceful shutdown: ``on_shutdown`` (the drain
        of gateway/lifecycle/drain.py) while handlers still run, connections closed within
        ``shutdown_timeout``, ``cleanup_ctx`` closed."""
        for server in self._listeners:
            server.close()
        self._listeners.clear()
        await self._runner.cleanup()


def make_runner(
    app: web.Application, header_timeout_s: float, body_timeout_s: float, **kwargs: Any
) -> GatewayRunner:
    """``kwargs`` as for ``web.AppRunner`` (shutdown_timeout, access_log, ...). A handler is
    cancelled when its client goes (or when the front answers for it: front.py)."""
    kwargs.setdefault("keepalive_timeout", 75.0)  # web.run_app's default (the handler's: 3630)
    kwargs.setdefault("handler_cancellation", True)
    return GatewayRunner(app, ReadDeadlines(header_timeout_s, body_timeout_s), **kwargs)


def run_app(
    app: web.Application,
    *,
    host: str,
    port: int,
    header_timeout_s: float,
    body_timeout_s: float,
    print: Callable[[str], None] = print,  # web.run_app's name for it
    **runner_kwargs: Any,
) -> None:
    """Serve ``app`` on ``host:port`` until SIGINT / SIGTERM, then clean up (``runner_kwargs``:
    shutdown_timeout, handler_cancellation, access_log, ...). Exceptions from the app's start-up
    propagate, as from ``web.run_app``.

    A signal only ends the wait: the clean-up (the drain of gateway/lifecycle/drain.py, where
    streams finish or end with an error event) runs while the handlers still run. A ``GracefulExit``
    raised by the signal would leave ``asyncio.run`` through its cancellation of every task,
    cutting all handlers at once before the clean-up starts."""
    runner = make_runner(app, header_timeout_s, body_timeout_s, **runner_kwargs)

    async def serve() -> None:
        stop = asyncio.Event()
        loop = asyncio.get_running_loop()
        for sig in (signal.SIGINT, signal.SIGTERM):
            loop.add_signal_handler(sig, stop.set)
        await runner.setup()
        try:
            await runner.listen_tcp(host, port)
            print(f"listening on http://{host}:{port}")
            await stop.wait()
        finally:
            await runner.cleanup()

    with contextlib.suppress(KeyboardInterrupt):
        asyncio.run(serve())
