"""Request framing: llhttp (through ``httptools``) reads every request of a connection, and what
aiohttp receives is the request as written again here.

The invariant: aiohttp's parser only ever sees heads written by :meth:`RequestFraming.feed`:

    METHOD target HTTP/1.x\\r\\n        (the method, target and version as parsed)
    Name: value\\r\\n                   (each header as received: name and value bytes, in order)
    \\r\\n

followed by the body as received (``Content-Length``) or re-chunked (``Transfer-Encoding:
chunked``: one chunk per piece received, extensions and trailers dropped, ``0`` chunk at the end).
llhttp is the parser aiohttp's own request parser is built on, in the same strict mode; the checks
aiohttp makes on top of it are made here as well (line and field limits, number of headers,
duplicate singleton headers, ``Host`` in HTTP/1.1, target forms, ``Transfer-Encoding`` other than
``chunked``, Content-Encodings it would fail to set up a decoder for, a deflate body that ends
before its stream does: :class:`DeflateEnd`). So a request passed on is one
aiohttp's parser accepts, and one it would refuse (answering with plain text that quotes the
offending line) is refused here instead: a :class:`Refusal` carrying an OpenAI-shaped error.
tests/gateway/http/test_http.py holds both parsers to that with hostile heads.
"""

from __future__ import annotations

import zlib
from dataclasses import dataclass
from typing import Any

import httptools
from yarl import URL

from gateway.errors import ApiError

MAX_LINE = 8190  # the request target (aiohttp's max_line_size)
MAX_FIELD = 8190  # one header, name + value (aiohttp's max_field_size)
MAX_HEADERS = 128  # aiohttp's max_headers
MAX_HEAD = 64 << 10  # an incomplete head: what is buffered before the deadline refuses it
# Headers aiohttp refuses to see twice in a request (its SINGLETON_HEADERS).
SINGLETONS = frozenset(
    {
        b"content-length",
        b"content-location",
        b"content-range",
        b"content-type",
        b"etag",
        b"host",
        b"max-forwards",
        b"server",
        b"transfer-encoding",
        b"user-agent",
    }
)
# Content-Encodings aiohttp sets a decoder up for before the app runs; br and zstd fail there
# without their optional packages, which kvgate does not install. The app refuses the others
# it cannot read (content_encoding_middleware).
UNDECODABLE = frozenset({b"br", b"zstd"})
MAX_INFLATE = 16 << 20  # deflate output inflated to find the stream's end (see DeflateEnd)


def malformed() -> ApiError:
    return ApiError(400, "malformed HTTP request", code="malformed_request")


def too_long() -> ApiError:
    return ApiError(400, "the request line or a header is too long", code="header_too_long")


def unsupported_encoding() -> ApiError:
    return ApiError(
        415,
        "unsupported Content-Encoding: send the body as gzip, deflate or unencoded",
        code="unsupported_content_encoding",
    )


def undecodable() -> ApiError:
    return ApiError(
        400, "the request body does not match its Content-Encoding", code="invalid_content_encoding"
    )


class DeflateEnd:
    """Whether a deflate body's stream is complete, as aiohttp checks when the body ends (it
    refuses one that is not as a protocol error, before the app could answer). A zlib stream,
    or a raw one when the first byte is no zlib header (as aiohttp reads it), of one or more
    members; inflated and dropped, at most ``MAX_INFLATE`` bytes. A stream that does not inflate
    is left to aiohttp: it fails as the view reads the body (answered by the app)."""

    def __init__(self) -> None:
        self._inflate: Any = None  # a zlib decompress object
        self._out = 0
        self.broken = False

    def feed(self, data: bytes) -> None:
        if self.broken or not data:
            return
        if self._inflate is None:
            self._inflate = zlib.decompressobj(zlib.MAX_WBITS if data[0] & 0xF == 8 else -15)
        try:
            while data and self._out <= MAX_INFLATE:
                self._out += len(self._inflate.decompress(data, 1 << 16))
                data = self._inflate.unconsumed_tail
                if self._inflate.eof and self._inflate.unused_data:  # the next member
                    data = self._inflate.unused_data
                    self._inflate = zlib.decompressobj(zlib.MAX_WBITS)
        except zlib.error:
            self.broken = True

    def complete(self) -> bool:
        """The body may end here without aiohttp refusing it."""
        if self.broken or self._inflate is None:  # broken: the view's read fails instead
            return True
        return self._inflate.eof and self._out <= MAX_INFLATE


class _Stop(Exception):
    """Raised in a parser callback to stop llhttp at a refusal."""


@dataclass(frozen=True)
class Begin:
    """The first byte of a request arrived."""


@dataclass(frozen=True)
class Head:
    data: bytes  # the head as written for aiohttp
    has_body: bool


@dataclass(frozen=True)
class Body:
    data: bytes  # the next piece of the body as written for aiohttp


@dataclass(frozen=True)
class End:
    """The request is complete."""


@dataclass(frozen=True)
class Refusal:
    """The request cannot be passed on; ``error`` is its answer. Always the last event."""

    error: ApiError


Event = Begin | Head | Body | End | Refusal
_BEGIN, _END = Begin(), End()


class RequestFraming:
    """One connection's requests, in order: feed bytes, get :data:`Event` s. After a
    :class:`Refusal` the rest of the connection's bytes are not read."""

    def __init__(self) -> None:
        self._parser = httptools.HttpRequestParser(self)
        self._events: list[Event] = []
        self._refusal: ApiError | None = None
        self._in_head = False
        self._head_bytes = 0
        self._reset()

    def _reset(self) -> None:
        self._url = b""
        self._headers: list[tuple[bytes, bytes]] = []
        self._seen: set[bytes] = set()
        self._encoding = b""
        self._te: bytes | None = None
        self._length = 0
        self._chunked = False
        self._headers_done = False
        self._deflate: DeflateEnd | None = None

    def feed(self, data: bytes) -> list[Event]:
        if self._refusal is not None:
            return []
        while True:
            try:
                self._parser.feed_data(data)
                break
            except httptools.HttpParserUpgrade as upgrade:
                # The request asked for another protocol; aiohttp answers it over HTTP (kvgate
                # switches to none), so what follows it is parsed as the next request.
                data = data[upgrade.args[0] :]
            except httptools.HttpParserError:
                self._refusal = self._refusal or malformed()
                break
        if self._in_head and self._refusal is None:
            self._head_bytes += len(data)
            if self._head_bytes > MAX_HEAD:
                self._refusal = too_long()
        events, self._events = self._events, []
        if self._refusal is not None:
            events.append(Refusal(self._refusal))
        return events

    def _stop(self, error: ApiError) -> None:
        self._refusal = error
        raise _Stop

    # -- llhttp callbacks ---------------------------------------------------------------------
    def on_message_begin(self) -> None:
        self._reset()
        self._in_head, self._head_bytes = True, 0
        self._events.append(_BEGIN)

    def on_url(self, url: bytes) -> None:
        self._url += url
        if len(self._url) > MAX_LINE:
            self._stop(too_long())

    def on_header(self, name: bytes, value: bytes) -> None:
        if self._headers_done:
            return  # a trailer of a chunked body: dropped
        if len(name) + len(value) > MAX_FIELD:
            self._stop(too_long())
        lower = name.lower()
        if len(self._headers) >= MAX_HEADERS or (lower in SINGLETONS and lower in self._seen):
            self._stop(malformed())
        if lower == b"sec-websocket-key1":  # the pre-RFC 6455 handshake aiohttp refuses
            self._stop(malformed())
        self._seen.add(lower)
        if lower == b"content-encoding":
            self._encoding = value.strip().lower()
        elif lower == b"transfer-encoding":
            self._te = value.strip().lower()
        elif lower == b"content-length":
            self._length = int(value)  # llhttp checked it: digits only
        self._headers.append((name, value))

    def on_headers_complete(self) -> None:
        self._headers_done, self._in_head = True, False
        method = self._parser.get_method()
        version = self._parser.get_http_version()
        if error := self._head_error(method, version):
            self._stop(error)
        self._chunked = self._te is not None
        has_body = self._chunked or self._length > 0
        if self._encoding in UNDECODABLE:  # aiohttp sets its decoder up even with no body
            self._stop(unsupported_encoding())
        if has_body and self._encoding == b"deflate":
            self._deflate = DeflateEnd()
        lines = [b"%s %s HTTP/%s\r\n" % (method, self._url, version.encode())]
        lines += [b"%s: %s\r\n" % header for header in self._headers]
        lines.append(b"\r\n")
        self._events.append(Head(b"".join(lines), has_body))

    def _head_error(self, method: bytes, version: str) -> ApiError | None:
        if version not in ("1.1", "1.0"):
            return malformed()
        if method == b"CONNECT":  # a tunnel: kvgate is no proxy
            return ApiError(405, "CONNECT is not supported", code="method_not_allowed")
        if version == "1.1" and b"host" not in self._seen:
            return malformed()
        if self._te is not None and self._te != b"chunked":  # aiohttp reads chunked alone
            return malformed()
        return None if _target_ok(method, self._url) else malformed()

    def on_body(self, body: bytes) -> None:
        if self._deflate is not None:
            self._deflate.feed(body)
        if self._chunked:
            self._events.append(Body(b"%x\r\n%s\r\n" % (len(body), body)))
            return
        self._length -= len(body)
        if self._length == 0 and not self._deflate_complete():
            self._stop(undecodable())  # the last byte is kept from aiohttp
        self._events.append(Body(bytes(body)))

    def on_message_complete(self) -> None:
        if self._chunked:
            if not self._deflate_complete():
                self._stop(undecodable())  # the last chunk is kept from aiohttp
            self._events.append(Body(b"0\r\n\r\n"))
        self._events.append(_END)

    def _deflate_complete(self) -> bool:
        return self._deflate is None or self._deflate.complete()


def _target_ok(method: bytes, target: bytes) -> bool:
    """The target forms aiohttp's parser builds a URL of: origin-form, ``*`` for OPTIONS, or an
    absolute URL with a host."""
    if target.startswith(b"/"):
        return True
    if target == b"*":
        return method == b"OPTIONS"
    try:
        url = URL(target.decode("ascii"), encoded=True)
    except (UnicodeDecodeError, ValueError):
        return False
    return url.absolute and url.raw_host is not None
