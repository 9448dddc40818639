"""The generate hot path: HTTP/1.1 on pooled keep-alive connections, written and parsed here.

aiohttp's client spends a few hundred microseconds per request building the request and parsing
the response; a generate call is one POST whose response is a chunked stream of NDJSON frames, so
the request is one buffer and the response is read with ``readline`` / ``readexactly``::

    -> POST /v1/generate HTTP/1.1 | headers | body
    <- HTTP/1.1 200 OK | Transfer-Encoding: chunked | <size> CRLF <frames> CRLF ... 0 CRLF CRLF
    <- HTTP/1.1 200 OK | Content-Length: n | {"e": ...}           (refused at admission)

A connection goes back to the pool only after a response was read to its end; a stream left
early closes its connection, which is how the worker learns to abort the request.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator
from urllib.parse import urlsplit


class HttpError(Exception):
    """The connection failed or the response was not HTTP/1.1 as expected."""

    def __init__(self, message: str, *, refused: bool = False) -> None:
        super().__init__(message)
        self.refused = refused  # nothing listens at the address


class Response:
    def __init__(self, pool: ConnectionPool, conn: _Conn, status: int, headers: dict[str, str]):
        self.status = status
        self.headers = headers
        self._pool, self._conn = pool, conn
        self._done = False

    async def body(self) -> bytes:
        return b"".join([part async for part in self.parts()])

    async def parts(self) -> AsyncIterator[bytes]:
        """The body as it arrives (one chunk at a time for a chunked response)."""
        r = self._conn.reader
        try:
            if self.headers.get("transfer-encoding", "").lower() == "chunked":
                while size := int((await r.readline()).split(b";")[0], 16):
                    data = await r.readexactly(size + 2)
                    yield data[:-2]
                while (await r.readline()) not in (b"\r\n", b""):
                    pass  # trailers
            else:
                yield await r.readexactly(int(self.headers.get("content-length", "0")))
        except (OSError, ValueError, asyncio.IncompleteReadError) as exc:
            raise HttpError(f"response body: {type(exc).__name__}") from None
        self._done = True

    def release(self) -> None:
        """Back to the pool if read to the end, else closed (the worker sees the caller go)."""
        conn, self._conn = self._conn, None  # type: ignore[assignment]
        if conn is not None:
            self._pool.put(conn, reusable=self._done and self.headers.get("connection") != "close")


class _Conn:
    def __init__(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        self.reader, self.writer = reader, writer

    def close(self) -> None:
        with contextlib.suppress(Exception):
            self.writer.close()


class ConnectionPool:
    """``unix_path``: connect to that Unix domain socket instead (same HTTP, no TCP stack)."""

    def __init__(self, url: str, max_idle: int = 64, unix_path: str | None = None) -> None:
        parts = urlsplit(url)
        self.unix_path = unix_path
        self.host, self.port = parts.hostname or "127.0.0.1", parts.port or 80
        self._host_header = parts.netloc
        self._idle: list[_Conn] = []
        self._max_idle = max_idle

    async def request(
        self,
        method: str,
        path: str,
        headers: dict[str, str],
        body: bytes,
        connect_timeout_s: float,
        head_timeout_s: float | None = None,
    ) -> Response:
        """Send and read the response head; a reused connection the server closed meanwhile
        is retried once on a fresh one (nothing was processed on it)."""
        for attempt in (0, 1):
            conn = self._idle.pop() if self._idle and attempt == 0 else None
            fresh = conn is None
            if conn is None:
                conn = await self._open(connect_timeout_s)
            try:
                return await self._exchange(conn, method, path, headers, body, head_timeout_s)
            except HttpError:
                conn.close()
                if fresh:
                    raise
        raise AssertionError("unreachable")

    async def _open(self, timeout_s: float) -> _Conn:
        try:
            async with asyncio.timeout(timeout_s):
                if self.unix_path is not None:
                    reader, writer = await asyncio.open_unix_connection(self.unix_path)
                else:
                    reader, writer = await asyncio.open_connection(self.host, self.port)
        except (OSError, TimeoutError) as exc:
            # nothing listens: refused (TCP), or the socket file is gone (Unix)
            refused = isinstance(exc, ConnectionRefusedError | FileNotFoundError)
            raise HttpError(f"connect: {type(exc).__name__}", refused=refused) from None
        return _Conn(reader, writer)

    async def _exchange(
        self,
        conn: _Conn,
        method: str,
        path: str,
        headers: dict[str, str],
        body: bytes,
        timeout_s: float | None,
    ) -> Response:
        head = [f"{method} {path} HTTP/1.1", f"Host: {self._host_header}"]
        head += [f"{k}: {v}" for k, v in headers.items()]
        head.append(f"Content-Length: {len(body)}")
        try:
            conn.writer.write(("\r\n".join(head) + "\r\n\r\n").encode("latin-1") + body)
            async with asyncio.timeout(timeout_s):
                status_line = await conn.reader.readline()
                if not status_line:
                    raise HttpError("connection closed before the response")
                status = int(status_line.split()[1])
                fields: dict[str, str] = {}
                while (line := await conn.reader.readline()) not in (b"\r\n", b""):
                    name, _, value = line.decode("latin-1").partition(":")
                    fields[name.strip().lower()] = value.strip()
        except (OSError, ValueError, IndexError, TimeoutError) as exc:
            raise HttpError(f"response head: {type(exc).__name__}") from None
        return Response(self, conn, status, fields)

    def put(self, conn: _Conn, *, reusable: bool) -> None:
        if reusable and len(self._idle) < self._max_idle and not conn.writer.is_closing():
            self._idle.append(conn)
        else:
            conn.close()

    def close(self) -> None:
        for conn in self._idle:
            conn.close()
        self._idle.clear()
