"""The generate route on a plain asyncio protocol, in front of the worker's aiohttp application.

A gateway keeps a pool of connections that carry nothing but generate calls
(gateway/cluster/stream.py). Those are served here, with the least work a request can take:
one buffer parsed for the request line, header fields and a ``Content-Length`` body, one write
for the response head with the first frame, one for the last frame with the chunked end. With a
2 ms pause between calls (a worker at rest between requests), a POST answered with two frames
over a Unix socket took 0.20-0.23 ms here against 0.35-0.40 ms through aiohttp.

Any request that is not ``POST /v1/generate`` hands the connection, with the bytes read so far,
to aiohttp's protocol for the rest of its life (``transport.set_protocol``), so every route,
probes included, is still served on the same port and socket::

    bytes in -> request head (<= MAX_HEAD bytes) -> POST /v1/generate?
        yes: token check (401), Content-Length body (<= max_body; 411 without one) ->
             engine/worker/server.py serve_generate -> chunked NDJSON frames out
        no:  aiohttp's RequestHandler takes the connection over

A connection that closes while a request streams cancels its task, which aborts the engine
request (as aiohttp's handler cancellation does on the other routes).
"""

from __future__ import annotations

import asyncio
import contextlib
import hmac
import logging
from collections.abc import Callable

from engine.worker import wire
from engine.worker.server import MAX_BODY, WorkerState, serve_generate

log = logging.getLogger(__name__)
MAX_HEAD = 64 << 10
GENERATE = ("POST", "/v1/generate")
_REASONS = {200: "OK", 400: "Bad Request", 401: "Unauthorized", 411: "Length Required"}
_REASONS |= {413: "Payload Too Large", 431: "Request Header Fields Too Large"}
_STREAM_HEAD = (
    b"HTTP/1.1 200 OK\r\nContent-Type: application/x-ndjson\r\nTransfer-Encoding: chunked\r\n\r\n"
)


class GenerateConnections:
    """The protocol factory for the worker's listeners, and its open generate connections."""

    def __init__(
        self, state: WorkerState, fallback: Callable[[], asyncio.Protocol], max_body: int = MAX_BODY
    ) -> None:
        if not state.token:
            raise ValueError("a worker needs a token (KVGATE_WORKER_TOKEN)")
        self.state = state
        self.expected_auth = f"Bearer {state.token}".encode()
        self.fallback = fallback  # aiohttp's protocol factory (AppRunner.server)
        self.max_body = max_body
        self.open: set[GenerateProtocol] = set()

    def __call__(self) -> GenerateProtocol:
        return GenerateProtocol(self)

    async def close(self) -> None:
        """Close every connection still served here; their requests are aborted."""
        tasks = [p.task for p in self.open if p.task is not None]
        for p in list(self.open):
            p.close()
        for task in tasks:
            with contextlib.suppress(BaseException):
                await task


class _Refused(Exception):
    def __init__(self, status: int, message: str, *, close: bool = True) -> None:
        super().__init__(message)
        self.status, self.close = status, close


class GenerateProtocol(asyncio.Protocol):
    def __init__(self, owner: GenerateConnections) -> None:
        self._owner = owner
        self._transport: asyncio.Transport | None = None
        self._buf = bytearray()
        self.task: asyncio.Task[None] | None = None
        self._keep_alive = True
        self._head_sent = False
        self._writable: asyncio.Future[None] | None = None  # set while the transport is paused

    # -- asyncio.Protocol ---------------------------------------------------------------------
    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        assert isinstance(transport, asyncio.Transport)
        self._transport = transport
        self._owner.open.add(self)

    def data_received(self, data: bytes) -> None:
        self._buf += data
        if self.task is None:  # else: read after the request in flight ends
            self._next_request()

    def connection_lost(self, exc: Exception | None) -> None:
        self._owner.open.discard(self)
        self._transport = None
        if self.task is not None:
            self.task.cancel()  # the caller left: the engine request is aborted
        self._wake_writer()

    def pause_writing(self) -> None:
        if self._writable is None:
            self._writable = asyncio.get_running_loop().create_future()

    def resume_writing(self) -> None:
        self._wake_writer()

    def close(self) -> None:
        if self._transport is not None:
            self._transport.close()

    # -- requests -----------------------------------------------------------------------------
    def _next_request(self) -> None:
        end = self._buf.find(b"\r\n\r\n")
        if end < 0:
            if len(self._buf) > MAX_HEAD:
                self._refuse(_Refused(431, "request head too large"))
            return
        try:
            method, path, fields = _parse_head(bytes(self._buf[:end]))
        except ValueError:
            self._refuse(_Refused(400, "malformed request"))
            return
        if (method, path) != GENERATE:
            self._hand_over()
            return
        try:
            length = self._check(fields)
        except _Refused as refused:
            self._refuse(refused)
            return
        start = end + 4
        if len(self._buf) < start + length:
            return  # the body is still arriving
        body = bytes(self._buf[start : start + length])
        del self._buf[: start + length]
        self._keep_alive = fields.get("connection", "").lower() != "close"
        self._head_sent = False
        self.task = asyncio.get_running_loop().create_task(self._serve(body))

    def _check(self, fields: dict[str, str]) -> int:
        given = fields.get("authorization", "").encode("latin-1")
        if not hmac.compare_digest(given, self._owner.expected_auth):
            raise _Refused(401, "unauthorized")
        if "transfer-encoding" in fields or "content-length" not in fields:
            raise _Refused(411, "a Content-Length body is required")
        try:
            length = int(fields["content-length"])
        except ValueError:
            raise _Refused(400, "bad Content-Length") from None
        if not 0 <= length <= self._owner.max_body:
            raise _Refused(413, "request body too large")
        return length

    async def _serve(self, body: bytes) -> None:
        try:
            await serve_generate(self._owner.state, body, self)
        except ConnectionError:
            self.close()
        except Exception:  # a bug: this call fails, the worker goes on
            log.exception("generate call failed")
            self.close()
        finally:
            self.task = None
        if not self._keep_alive:
            self.close()
        elif self._transport is not None and self._buf:
            self._next_request()

    def _hand_over(self) -> None:
        """aiohttp serves this connection from here on, starting with the bytes read."""
        transport, data = self._transport, bytes(self._buf)
        assert transport is not None
        self._owner.open.discard(self)
        protocol = self._owner.fallback()
        transport.set_protocol(protocol)
        protocol.connection_made(transport)
        protocol.data_received(data)

    def _refuse(self, refused: _Refused) -> None:
        body = wire.encode({"error": str(refused)})
        self._write(_head(refused.status, len(body), close=refused.close) + body)
        if refused.close:
            self.close()
        else:
            self._buf.clear()

    # -- serve_generate's sink ----------------------------------------------------------------
    async def reply(self, status: int, body: bytes) -> None:
        """A whole JSON answer (refused before any output)."""
        self._write(_head(status, len(body), close=not self._keep_alive) + body)

    async def frame(self, data: bytes) -> None:
        """One frame of the stream; the first goes out with the response head."""
        chunk = _chunk(data)
        self._write(chunk if self._head_sent else _STREAM_HEAD + chunk)
        self._head_sent = True
        if self._writable is not None:
            await self._writable

    async def last(self, data: bytes) -> None:
        """The final frame and the end of the stream, in one write."""
        tail = _chunk(data) + b"0\r\n\r\n"
        self._write(tail if self._head_sent else _STREAM_HEAD + tail)

    def _write(self, data: bytes) -> None:
        if self._transport is None or self._transport.is_closing():
            raise ConnectionResetError("the caller closed the connection")
        self._transport.write(data)

    def _wake_writer(self) -> None:
        waiter, self._writable = self._writable, None
        if waiter is not None and not waiter.done():
            waiter.set_result(None)


def _parse_head(head: bytes) -> tuple[str, str, dict[str, str]]:
    """(method, path, header fields with lowercase names); ValueError if not HTTP/1.x."""
    request_line, *lines = head.decode("latin-1").split("\r\n")
    method, path, version = request_line.split(" ")
    if not version.startswith("HTTP/1."):
        raise ValueError(version)
    fields: dict[str, str] = {}
    for line in lines:
        name, sep, value = line.partition(":")
        if not sep or not name or name != name.strip():
            raise ValueError(line)
        fields[name.lower()] = value.strip()
    return method, path, fields


def _head(status: int, length: int, *, close: bool) -> bytes:
    head = f"HTTP/1.1 {status} {_REASONS.get(status, 'Error')}\r\n"
    head += f"Content-Type: application/json\r\nContent-Length: {length}\r\n"
    if close:
        head += "Connection: close\r\n"
    return (head + "\r\n").encode("latin-1")


def _chunk(data: bytes) -> bytes:
    return b"%x\r\n%b\r\n" % (len(data), data)
