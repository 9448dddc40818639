"""The front of every client connection: an asyncio protocol of its own between the socket and
the protocol that aiohttp's ``web.Server`` makes.

    socket ──► FrontProtocol ── requests as framing.py writes them ──► aiohttp's handler
       ▲          │  deadlines, refusals                                    │
       └──────────┴──────────── InnerTransport (transport.py) ◄─────────────┘ responses

* **One request at a time inside aiohttp.** A request is passed on (its head, then its body as
  it arrives) only when aiohttp has finished the answer to the previous one (``response_done``,
  which the access logger of runner.py calls once the response is written). Pipelined requests
  wait here, read and checked as they arrive, at most ``MAX_BUFFERED`` bytes before reading
  pauses. So the front knows which request aiohttp is on, and writes an answer of its own only
  when aiohttp is between requests, or is on the refused request and has written nothing for it
  (it then takes the connection over: aiohttp's later writes are dropped, and it sees the
  connection lost, which cancels its handler).
* **Header deadline.** A request's head must be complete ``header_s`` after its first byte (a new
  connection's first request: after the connection opened); past it the client gets a 408
  (nothing at all if it sent nothing) and the connection is closed. While aiohttp is still
  answering an earlier request the deadline does not pass, and it starts again once that answer
  is written: the client is not the one late.
* **Body deadline.** The body must be complete ``body_s`` after it was passed on (aiohttp started
  on the request). Past it: a 408 if aiohttp has written nothing for the request yet (its
  handler waits for the body), else the connection is closed (the answer went out while the
  rest of the body never came, it is being streamed and cannot be completed, or aiohttp wrote
  an interim ``100 Continue`` and the body did not follow).
* **Malformed requests** (framing.py) are answered 400 / 405 / 415 in order: after the answers to
  the requests before them. Every answer of the front is OpenAI-shaped, carries ``x-request-id``,
  closes the connection, never quotes the request, and is logged as one ``request_refused`` line.
"""

from __future__ import annotations

import asyncio
import json
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass, field
from http import HTTPStatus

from gateway.errors import ApiError, log_refusal, new_request_id
from gateway.http.framing import Begin, Body, End, Event, Head, Refusal, RequestFraming
from gateway.http.transport import InnerTransport

MAX_BUFFERED = 256 << 10  # bytes of requests waiting for aiohttp before reading pauses


@dataclass(frozen=True)
class ReadDeadlines:
    header_s: float  # first byte of a request -> end of its headers
    body_s: float  # the request passed on to aiohttp -> end of its body


def body_timeout_error() -> ApiError:
    return ApiError(408, "the request body did not arrive in time", code="body_timeout")


def header_timeout_error() -> ApiError:
    return ApiError(408, "the request headers did not arrive in time", code="header_timeout")


@dataclass
class _Request:
    """A request read from the client, not yet (fully) passed on to aiohttp."""

    out: list[bytes] = field(default_factory=list)  # for aiohttp, in order
    head_done: bool = False
    has_body: bool = False
    complete: bool = False
    refusal: ApiError | None = None  # refused: answer this instead of passing it on


class FrontProtocol(asyncio.Protocol):
    def __init__(self, inner: Callable[[], asyncio.Protocol], deadlines: ReadDeadlines) -> None:
        self._make_inner = inner
        self._deadlines = deadlines
        self._framing = RequestFraming()
        self._waiting: deque[_Request] = deque()  # head complete (or refused), not passed on
        self._incoming: _Request | None = None  # the request whose bytes are arriving
        self._feeding: _Request | None = None  # passed on, body still arriving
        self._busy = False  # aiohttp is answering a request passed on
        self._buffered = 0
        self._inner_paused = self._reading_paused = False
        self._batch: list[bytes] | None = None  # bytes for aiohttp while events are handled
        self._header_timer: asyncio.TimerHandle | None = None
        self._body_timer: asyncio.TimerHandle | None = None
        self.taken_over = False

    # -- asyncio's protocol interface ---------------------------------------------------------
    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        assert isinstance(transport, asyncio.Transport)
        self._loop = asyncio.get_running_loop()
        self._real = transport
        self._inner = InnerTransport(transport, self)
        self._inner.set_protocol(self._make_inner())
        self._inner.get_protocol().connection_made(self._inner)
        self._arm_header_timer()  # a connection that sends nothing is closed as well

    def data_received(self, data: bytes) -> None:
        if self.taken_over or self._refused():
            return
        self._batch = []
        try:
            for event in self._framing.feed(data):
                self._on_event(event)
        finally:
            batch, self._batch = self._batch, None
            if batch:
                self._pass_on(b"".join(batch))
        self._update_reading()

    def eof_received(self) -> bool | None:
        return self._protocol().eof_received()

    def connection_lost(self, exc: Exception | None) -> None:
        self._cancel_timers()
        self._protocol().connection_lost(exc)

    def pause_writing(self) -> None:
        self._protocol().pause_writing()

    def resume_writing(self) -> None:
        self._protocol().resume_writing()

    def _protocol(self) -> asyncio.Protocol:
        protocol = self._inner.get_protocol()
        assert isinstance(protocol, asyncio.Protocol)
        return protocol

    # -- reading requests ---------------------------------------------------------------------
    def _on_event(self, event: Event) -> None:
        if isinstance(event, Begin):
            self._incoming = _Request()
            if self._header_timer is None:
                self._arm_header_timer()
        elif isinstance(event, Head):
            self._head_done(event)
        elif isinstance(event, Body):
            self._body(event.data)
        elif isinstance(event, End):
            self._end()
        else:
            self._refusal(event)

    def _head_done(self, head: Head) -> None:
        assert self._incoming is not None
        self._cancel_header_timer()
        request = self._incoming
        request.head_done, request.has_body = True, head.has_body
        self._queue(request, head.data)
        self._waiting.append(request)
        self._advance()

    def _body(self, data: bytes) -> None:
        request = self._incoming
        assert request is not None
        if request is self._feeding:
            self._forward(data)
        else:
            self._queue(request, data)

    def _end(self) -> None:
        request = self._incoming
        assert request is not None
        request.complete = True
        self._incoming = None
        if request is self._feeding:
            self._feeding = None
            self._cancel_body_timer()

    def _refusal(self, event: Refusal) -> None:
        request = self._incoming
        self._cancel_header_timer()
        if request is not None and request is self._feeding:
            self._late_or_broken_body(event.error)
            return
        if request is not None and request in self._waiting:  # passed on never: dropped
            self._waiting.remove(request)
            self._buffered -= sum(len(piece) for piece in request.out)
        self._waiting.append(_Request(refusal=event.error))
        self._advance()

    def _queue(self, request: _Request, data: bytes) -> None:
        request.out.append(data)
        self._buffered += len(data)

    # -- passing requests on --------------------------------------------------------------------
    def _advance(self) -> None:
        """Pass the next waiting request on, or answer it if refused, when aiohttp is free."""
        if self._busy or self.taken_over or not self._waiting or self._inner.is_closing():
            return
        request = self._waiting.popleft()
        if request.refusal is not None:
            self._answer(request.refusal)
            return
        self._busy = True
        self._inner.written = 0
        self._buffered -= sum(len(piece) for piece in request.out)
        data, request.out = b"".join(request.out), []
        if request.has_body and not request.complete:
            self._feeding = request
            self._body_timer = self._loop.call_later(self._deadlines.body_s, self._body_late)
        self._forward(data)

    def _forward(self, data: bytes) -> None:
        if self._batch is not None:
            self._batch.append(data)
        else:
            self._pass_on(data)

    def _pass_on(self, data: bytes) -> None:
        if not self.taken_over and not self._inner.is_closing():
            self._protocol().data_received(data)

    def response_done(self) -> None:
        """aiohttp wrote the whole answer to the request passed on (called as it logs it)."""
        self._loop.call_soon(self._done)

    def _done(self) -> None:
        self._busy = False
        if self._incoming is not None and self._header_timer is not None:
            # A head that was waiting behind aiohttp's answer gets its full time from now.
            self._cancel_header_timer()
            self._arm_header_timer()
        self._advance()
        self._update_reading()

    # -- deadlines ------------------------------------------------------------------------------
    def _arm_header_timer(self) -> None:
        self._header_timer = self._loop.call_later(self._deadlines.header_s, self._header_late)

    def _header_late(self) -> None:
        self._header_timer = None
        if self._busy:  # a pipelined request waits for the answer aiohttp is writing
            self._arm_header_timer()
        elif self._incoming is not None:
            self._answer(header_timeout_error())
        elif not self._waiting:
            self._real.close()  # not a byte of a request: nothing to answer

    def _body_late(self) -> None:
        self._body_timer = None
        self._late_or_broken_body(body_timeout_error())

    def _late_or_broken_body(self, error: ApiError) -> None:
        """The body of the request passed on will not complete (late, or its framing broke)."""
        self._feeding = None
        self._cancel_body_timer()
        if self._busy and self._inner.written == 0:
            self._answer(error)  # aiohttp's handler waits for the body: its answer is this
        else:
            self._close()  # answered already (or mid-answer): the connection ends here

    def _cancel_header_timer(self) -> None:
        if self._header_timer is not None:
            self._header_timer.cancel()
            self._header_timer = None

    def _cancel_body_timer(self) -> None:
        if self._body_timer is not None:
            self._body_timer.cancel()
            self._body_timer = None

    def _cancel_timers(self) -> None:
        self._cancel_header_timer()
        self._cancel_body_timer()

    # -- answers and the connection's end -------------------------------------------------------
    def _answer(self, error: ApiError) -> None:
        """The front's own answer: aiohttp has nothing (more) to write on this connection."""
        rid = new_request_id()
        log_refusal(rid, error.status, error.code or error.type, "unmatched")
        self._real.write(raw_response(error, rid))
        self._close()

    def _close(self) -> None:
        self.taken_over = True
        self._cancel_timers()
        self._waiting.clear()
        self._real.close()

    def _refused(self) -> bool:
        return bool(self._waiting) and self._waiting[-1].refusal is not None

    def inner_close(self) -> None:
        """aiohttp closed the connection (its answer is written, or it is shutting down)."""
        self._cancel_timers()
        self._real.close()

    def inner_pause(self, paused: bool) -> None:
        self._inner_paused = paused
        self._update_reading()

    def _update_reading(self) -> None:
        pause = self._inner_paused or self._buffered > MAX_BUFFERED or self._refused()
        if pause != self._reading_paused and not self._real.is_closing():
            self._reading_paused = pause
            (self._real.pause_reading if pause else self._real.resume_reading)()


def raw_response(error: ApiError, rid: str) -> bytes:
    body = json.dumps(error.body()).encode()
    head = (
        f"HTTP/1.1 {error.status} {HTTPStatus(error.status).phrase}\r\n"
        "Content-Type: application/json; charset=utf-8\r\n"
        f"Content-Length: {len(body)}\r\nConnection: close\r\nx-request-id: {rid}\r\n\r\n"
    )
    return head.encode() + body
