"""A minimal HTTP/1.1 keep-alive client for latency benchmarks on loopback.

A benchmark that runs its client on the server's event loop charges the client's own CPU to the
server. aiohttp's client spends about 0.6 ms per request building the request and parsing the
response; this one writes the request in one buffer and reads a ``Content-Length`` response
(``post_json``) or a chunked event stream to its end (``post_stream``).
"""

from __future__ import annotations

import asyncio
import json
from typing import Any


class RawHttpClient:
    def __init__(self, host: str, port: int) -> None:
        self.host, self.port = host, port
        self._reader: asyncio.StreamReader | None = None
        self._writer: asyncio.StreamWriter | None = None

    async def post_json(
        self, path: str, body: dict[str, Any], headers: dict[str, str]
    ) -> tuple[int, Any]:
        """POST ``body`` as JSON; returns (status, decoded JSON body)."""
        status, fields = await self._send(path, body, headers)
        if "content-length" not in fields:
            raise RuntimeError("response without Content-Length (see post_stream)")
        assert self._reader is not None
        return status, json.loads(await self._reader.readexactly(int(fields["content-length"])))

    async def post_stream(
        self, path: str, body: dict[str, Any], headers: dict[str, str]
    ) -> tuple[int, bytes]:
        """POST ``body`` as JSON and read a chunked response to its end: (status, body)."""
        status, fields = await self._send(path, body, headers)
        if fields.get("transfer-encoding", "").lower() != "chunked":
            raise RuntimeError("expected a chunked response")
        r = self._reader
        assert r is not None
        parts = []
        while size := int((await r.readline()).split(b";")[0], 16):
            parts.append((await r.readexactly(size + 2))[:-2])
        await r.readline()  # the empty line after the last chunk
        return status, b"".join(parts)

    async def _send(
        self, path: str, body: dict[str, Any], headers: dict[str, str]
    ) -> tuple[int, dict[str, str]]:
        """Write the request; read the status line and the header fields (names lowercase)."""
        if self._writer is None:
            self._reader, self._writer = await asyncio.open_connection(self.host, self.port)
        assert self._reader is not None
        payload = json.dumps(body).encode()
        lines = [f"POST {path} HTTP/1.1", f"Host: {self.host}:{self.port}"]
        lines += ["Content-Type: application/json", f"Content-Length: {len(payload)}"]
        lines += [f"{k}: {v}" for k, v in headers.items()]
        self._writer.write(("\r\n".join(lines) + "\r\n\r\n").encode() + payload)
        status = int((await self._reader.readline()).split()[1])
        fields: dict[str, str] = {}
        while (line := await self._reader.readline()) not in (b"\r\n", b""):
            name, _, value = line.decode("latin-1").partition(":")
            fields[name.strip().lower()] = value.strip()
        return status, fields

    async def close(self) -> None:
        if self._writer is not None:
            self._writer.close()
            await self._writer.wait_closed()
            self._writer = None
