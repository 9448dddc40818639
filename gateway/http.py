"""The HTTP layer under the app: read deadlines, malformed requests, aiohttp's own log lines.

aiohttp parses a request before any middleware sees it, so three things live here, below the app:

* **Read deadlines.** A request's headers must be complete ``header_s`` after its first byte (a
  new connection's first request: after the connection opened), its body ``body_s`` after the
  headers. Past the header deadline the client gets a 408 and the connection is closed; past the
  body deadline the body read fails with a 408 ``ApiError`` (answered by the error middleware)
  and the connection is closed after that answer (at once if the answer was already sent).
* **Malformed requests** (bad bytes in a header, broken framing, a body that does not match its
  Content-Encoding, an encoding with no decoder) are answered by :meth:`GatewayProtocol.
  handle_error` with an OpenAI-shaped 400 or 415 that never quotes the request (aiohttp's own
  answer is plain text quoting the offending header line, API key included), and logged as one
  ``request_refused`` line. Content-Encodings aiohttp does not decode at all are refused with 415
  by :func:`content_encoding_middleware`.
* **aiohttp's loggers** quote requests (the bad header line in a parse error, the request line,
  User-Agent and Referer in access lines): :func:`install_log_redaction` keeps only the message
  template, the exception type and its stack frames.

aiohttp has no public hook for the protocol class: :class:`GatewayRunner` takes the ``Server``
aiohttp builds and has it create :class:`GatewayProtocol` connections. That and the handler's
``_loop`` / ``_kwargs`` are the only aiohttp internals used; tests/gateway/test_http.py fails
when they change.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import signal
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import structlog
from aiohttp import web
from aiohttp.http_exceptions import ContentEncodingError, HttpProcessingError, LineTooLong
from aiohttp.streams import StreamReader
from aiohttp.web_protocol import RequestHandler

from gateway.errors import (
    ApiError,
    Handler,
    log_refusal,
    new_request_id,
    refuse,
    route_of,
    stack_summary,
)

log = structlog.get_logger(__name__)

# What aiohttp's parser decodes (br and zstd only with their optional packages; without them the
# parser refuses the request, answered as 415 by handle_error).
DECODED_ENCODINGS = frozenset({"gzip", "deflate", "br", "zstd"})
_ACCEPTED_ENCODINGS = DECODED_ENCODINGS | {"", "identity"}


@dataclass(frozen=True)
class ReadDeadlines:
    header_s: float  # first byte of a request -> end of its headers
    body_s: float  # end of the headers -> end of the body


def body_timeout_error() -> ApiError:
    return ApiError(408, "the request body did not arrive in time", code="body_timeout")


@web.middleware
async def content_encoding_middleware(request: web.Request, handler: Handler) -> web.StreamResponse:
    """415 for a body in a Content-Encoding aiohttp passes through undecoded (``x-gzip``,
    ``compress``, a list of encodings, anything unknown): the view would read compressed bytes."""
    encoding = request.headers.get("Content-Encoding", "").strip()
    known = encoding.isascii() and encoding.lower() in _ACCEPTED_ENCODINGS
    if request.body_exists and not known:
        raise _unsupported_encoding()
    return await handler(request)


def _unsupported_encoding() -> ApiError:
    return ApiError(
        415,
        "unsupported Content-Encoding: send the body as gzip, deflate or unencoded",
        code="unsupported_content_encoding",
    )


def protocol_error(status: int, exc: BaseException | None) -> ApiError:
    """The answer to a request aiohttp could not parse (or whose handling escaped the app)."""
    if isinstance(exc, ContentEncodingError):
        # Raised with "Please install ..." when the parser has no decoder for the encoding.
        if "install" in str(exc):
            return _unsupported_encoding()
        return ApiError(
            400,
            "the request body does not match its Content-Encoding",
            code="invalid_content_encoding",
        )
    if isinstance(exc, LineTooLong):
        return ApiError(400, "the request line or a header is too long", code="header_too_long")
    if isinstance(exc, HttpProcessingError) or 400 <= status < 500:
        return ApiError(400, "malformed HTTP request", code="malformed_request")
    if status == 504:
        return ApiError(504, "the request timed out", type_="timeout", code="timeout")
    return ApiError(500, "internal server error", type_="internal_error")


class GatewayProtocol(RequestHandler):
    """aiohttp's connection handler with read deadlines and quote-free error answers."""

    def __init__(self, manager: web.Server, *, deadlines: ReadDeadlines, **kwargs: Any) -> None:
        super().__init__(manager, **kwargs)
        self._gw_deadlines = deadlines
        self._gw_loop = kwargs["loop"]
        self._gw_header_timer: asyncio.TimerHandle | None = None
        self._gw_body_timer: asyncio.TimerHandle | None = None
        self._gw_between = True  # the next byte starts a request's headers
        self._gw_seen = False  # a byte of the pending request arrived
        self._gw_in_handler = False

    # -- connection events --------------------------------------------------------------------
    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        super().connection_made(transport)
        self._arm_header_timer()  # a connection that sends nothing is closed as well

    def connection_lost(self, exc: BaseException | None) -> None:
        self._cancel_timers()
        super().connection_lost(exc)

    def data_received(self, data: bytes) -> None:
        if self._gw_between and data:
            self._gw_seen = True
            if self._gw_header_timer is None:
                self._arm_header_timer()
        super().data_received(data)

    def request_started(self, payload: StreamReader) -> None:
        """Headers complete (called as aiohttp builds the request): the body deadline starts."""
        self._gw_in_handler = True
        self._gw_between = self._gw_seen = False
        self._cancel(self._gw_header_timer)
        self._gw_header_timer = None
        if payload.is_eof():
            self._gw_between = True
            return
        self._gw_body_timer = self._gw_loop.call_later(
            self._gw_deadlines.body_s, self._body_late, payload
        )
        payload.on_eof(self._body_done)

    async def finish_response(
        self, request: web.BaseRequest, resp: web.StreamResponse, start_time: float | None
    ) -> tuple[web.StreamResponse, bool]:
        try:
            return await super().finish_response(request, resp, start_time)
        finally:
            self._gw_in_handler = False
            if request.content.exception() is not None:
                # The body failed (late, undecodable, cut short): the answer is written; the
                # rest of the body cannot be drained, so the connection ends here.
                self.force_close()

    # -- deadlines ------------------------------------------------------------------------------
    def _arm_header_timer(self) -> None:
        self._gw_header_timer = self._gw_loop.call_later(
            self._gw_deadlines.header_s, self._header_late
        )

    def _header_late(self) -> None:
        self._gw_header_timer = None
        if self._gw_in_handler:  # a pipelined request waits for the one in the handler
            self._arm_header_timer()
            return
        if self._gw_seen and self.transport is not None:
            rid = new_request_id()
            log_refusal(rid, 408, "header_timeout", "unmatched")
            self.transport.write(_raw_response(408, "Request Timeout", rid, _header_timeout()))
        self.force_close()

    def _body_done(self) -> None:
        self._cancel(self._gw_body_timer)
        self._gw_body_timer = None
        self._gw_between = True

    def _body_late(self, payload: StreamReader) -> None:
        self._gw_body_timer = None
        payload.set_exception(body_timeout_error())  # a read in the handler answers 408
        if not self._gw_in_handler:
            self.force_close()  # answered already: only unread body bytes were left

    def _cancel_timers(self) -> None:
        for timer in (self._gw_header_timer, self._gw_body_timer):
            self._cancel(timer)
        self._gw_header_timer = self._gw_body_timer = None

    @staticmethod
    def _cancel(timer: asyncio.TimerHandle | None) -> None:
        if timer is not None:
            timer.cancel()

    # -- errors and logs ------------------------------------------------------------------------
    def handle_error(
        self,
        request: web.BaseRequest,
        status: int = 500,
        exc: BaseException | None = None,
        message: str | None = None,
    ) -> web.StreamResponse:
        """aiohttp's error answer, without quoting the request (``message`` is ignored)."""
        err = protocol_error(status, exc)
        if err.status >= 500 and exc is not None:
            log.error("unhandled_error", route=route_of(request), error=stack_summary(exc))
        if request.writer.output_size > 0:
            raise ConnectionError("the response has started: no error answer possible")
        resp = refuse(request, err)
        resp.force_close()
        return resp

    def log_exception(self, *args: Any, **kwargs: Any) -> None:
        exc_info = kwargs.get("exc_info")
        exc = exc_info if isinstance(exc_info, BaseException) else None
        detail = stack_summary(exc) if exc is not None else "no exception"
        # args[0] is aiohttp's fixed template ("Unhandled exception"); its arguments are dropped.
        log.error("http_server_error", what=str(args[0]) if args else "", error=detail)


def _header_timeout() -> ApiError:
    return ApiError(408, "the request headers did not arrive in time", code="header_timeout")


def _raw_response(status: int, reason: str, rid: str, err: ApiError) -> bytes:
    body = json.dumps(err.body()).encode()
    head = (
        f"HTTP/1.1 {status} {reason}\r\nContent-Type: application/json; charset=utf-8\r\n"
        f"Content-Length: {len(body)}\r\nConnection: close\r\nx-request-id: {rid}\r\n\r\n"
    )
    return head.encode() + body


class GatewayServer(web.Server):
    """aiohttp's ``Server`` making :class:`GatewayProtocol` connections."""

    deadlines: ReadDeadlines

    @classmethod
    def adopt(cls, server: web.Server, deadlines: ReadDeadlines) -> GatewayServer:
        """The same server (handler, request factory, settings), making gateway connections."""
        adopted = cls.__new__(cls)
        adopted.__dict__.update(vars(server))
        adopted.deadlines = deadlines
        build = server.request_factory

        def request_factory(message: Any, payload: Any, protocol: Any, *rest: Any) -> Any:
            if isinstance(protocol, GatewayProtocol):
                protocol.request_started(payload)
            return build(message, payload, protocol, *rest)

        adopted.request_factory = request_factory
        return adopted

    def __call__(self) -> GatewayProtocol:
        return GatewayProtocol(self, loop=self._loop, deadlines=self.deadlines, **self._kwargs)


class GatewayRunner(web.AppRunner):
    """``web.AppRunner`` whose connections are :class:`GatewayProtocol`."""

    def __init__(self, app: web.Application, *, deadlines: ReadDeadlines, **kwargs: Any) -> None:
        super().__init__(app, **kwargs)
        self._gw_deadlines = deadlines

    async def _make_server(self) -> web.Server:
        install_log_redaction()
        return GatewayServer.adopt(await super()._make_server(), self._gw_deadlines)


# -- aiohttp's loggers --------------------------------------------------------------------------
AIOHTTP_LOGGERS = ("aiohttp.access", "aiohttp.server", "aiohttp.web", "aiohttp.internal")
_QUOTING_EXTRAS = ("first_request_line", "request_header", "response_header")


class AiohttpRedaction(logging.Filter):
    """Keeps an aiohttp record's template, drops its arguments, header extras and exception
    message (the type and stack frames stay). Access lines keep only the status."""

    def filter(self, record: logging.LogRecord) -> bool:
        if record.name == "aiohttp.access":
            record.msg = f"http_access status={record.__dict__.get('response_status', '-')}"
        elif record.exc_info and record.exc_info[1] is not None:
            record.msg = f"{record.msg} [{stack_summary(record.exc_info[1])}]"
        record.args = None
        record.exc_info = record.exc_text = None
        for name in _QUOTING_EXTRAS:
            record.__dict__.pop(name, None)
        return True


_REDACTION = AiohttpRedaction()


def install_log_redaction() -> None:
    """Idempotent; process-wide (aiohttp's loggers are module globals)."""
    for name in AIOHTTP_LOGGERS:
        logger = logging.getLogger(name)
        if _REDACTION not in logger.filters:
            logger.addFilter(_REDACTION)


def make_runner(
    app: web.Application, header_timeout_s: float, body_timeout_s: float, **kwargs: Any
) -> GatewayRunner:
    """The runner ``kvgate serve`` (and tests) serve the app with; ``kwargs`` as for
    ``web.AppRunner`` (shutdown_timeout, handler_cancellation, access_log, ...)."""
    kwargs.setdefault("keepalive_timeout", 75.0)  # web.run_app's default (the handler's: 3630)
    return GatewayRunner(app, deadlines=ReadDeadlines(header_timeout_s, body_timeout_s), **kwargs)


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
    """``web.run_app`` on a :class:`GatewayRunner`: serve until SIGINT / SIGTERM, then clean up
    (``runner_kwargs``: shutdown_timeout, handler_cancellation, access_log, ...). Exceptions
    from the app's start-up propagate, as from ``web.run_app``.

    A signal only ends the wait: the clean-up (the drain of gateway/drain.py, where streams
    finish or end with an error event) runs while the handlers still run. A ``GracefulExit``
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
            await web.TCPSite(runner, host, port).start()
            print(f"listening on http://{host}:{port}")
            await stop.wait()
        finally:
            await runner.cleanup()

    with contextlib.suppress(KeyboardInterrupt):
        asyncio.run(serve())
