"""A TCP proxy for fault injection in front of PostgreSQL (or any TCP server), on loopback.

Modes, switched at any time from the test's event loop::

    pass       forward both ways (the default)
    refuse     close the listener (new connections get ECONNREFUSED) and reset every open one,
               as when the server's host is down
    blackhole  accept new connections and keep open ones, but forward nothing and answer
               nothing in either direction, as when a server or a network path stalls
    restore()  back to pass: listen again; connections that were blackholed are closed (the
               server then rolls back whatever they had open)
"""

from __future__ import annotations

import asyncio
import contextlib
import socket
from collections.abc import AsyncIterator


class FaultProxy:
    def __init__(self, upstream_host: str, upstream_port: int) -> None:
        self._upstream = (upstream_host, upstream_port)
        self.mode = "pass"
        self.port = _free_port()
        self._server: asyncio.Server | None = None
        self._conns: set[tuple[asyncio.StreamWriter, asyncio.StreamWriter | None]] = set()
        self.accepted = 0

    async def start(self) -> None:
        self._server = await asyncio.start_server(self._accept, "127.0.0.1", self.port)

    async def refuse(self) -> None:
        self.mode = "refuse"
        await self._close_listener()
        self._reset_all()

    async def blackhole(self) -> None:
        self.mode = "blackhole"

    async def restore(self) -> None:
        self._reset_all()
        self.mode = "pass"
        if self._server is None:
            await self.start()

    async def close(self) -> None:
        await self._close_listener()
        self._reset_all()

    async def _close_listener(self) -> None:
        server, self._server = self._server, None
        if server is not None:
            server.close()
            # Not wait_closed(): it waits for the accepted connections' handlers too.

    def _reset_all(self) -> None:
        for client, upstream in list(self._conns):
            for writer in (client, upstream):
                if writer is not None:
                    with contextlib.suppress(Exception):
                        writer.transport.abort()
        self._conns.clear()

    async def _accept(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        self.accepted += 1
        if self.mode == "refuse":
            writer.transport.abort()
            return
        entry: tuple[asyncio.StreamWriter, asyncio.StreamWriter | None] = (writer, None)
        self._conns.add(entry)
        try:
            while self.mode == "blackhole" and entry in self._conns:
                await asyncio.sleep(0.02)  # accepted, never connected upstream
            if entry not in self._conns:
                return
            up_reader, up_writer = await asyncio.open_connection(*self._upstream)
            self._conns.discard(entry)
            entry = (writer, up_writer)
            self._conns.add(entry)
            await asyncio.gather(
                self._pipe(reader, up_writer, entry), self._pipe(up_reader, writer, entry)
            )
        except (OSError, asyncio.IncompleteReadError):
            pass
        finally:
            self._conns.discard(entry)
            for w in entry:
                if w is not None:
                    with contextlib.suppress(Exception):
                        w.transport.abort()

    async def _pipe(
        self,
        reader: asyncio.StreamReader,
        writer: asyncio.StreamWriter,
        entry: tuple[asyncio.StreamWriter, asyncio.StreamWriter | None],
    ) -> None:
        while entry in self._conns:
            data = await reader.read(65536)
            if not data:
                break
            # Blackholed: the bytes are swallowed (the peer sees a silent, open connection).
            if self.mode == "pass":
                writer.write(data)
                await writer.drain()
        with contextlib.suppress(Exception):
            writer.transport.abort()


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


@contextlib.asynccontextmanager
async def fault_proxy(host: str = "127.0.0.1", port: int = 5432) -> AsyncIterator[FaultProxy]:
    proxy = FaultProxy(host, port)
    await proxy.start()
    try:
        yield proxy
    finally:
        await proxy.close()
