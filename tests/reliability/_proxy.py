"""A TCP proxy for fault injection in front of PostgreSQL (or any TCP server), on loopback.

Modes, switched at any time from the test's event loop::

    pass       forward both ways (the default)
    refuse     close the listener (new connections get ECONNREFUSED) and reset every open one,
               as when the server's host is down
    blackhole  accept new connections and keep open ones, but forward nothing and answer
               nothing in either direction, as when a server or a network path stalls
    restore()  back to pass: listen again; connections that were blackholed are closed (the
               server then rolls back whatever they had open)
    reopen()   back to pass for new connections only: the blackholed ones stay silent for good,
               as when a firewall, NAT or load balancer between forgot them during the outage
               and drops their packets without a reset
    partition  a network partition: nothing moves in either direction, nothing is lost or
               reset; new connections are accepted and wait
    heal()     the partition ends: every connection, open or new, carries on with the bytes
               held (a peer that gave up meanwhile sees its connection closed)
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
        self._forgotten: set[asyncio.StreamWriter] = set()  # client sides reopen() left silent
        self.accepted = 0

    async def start(self) -> None:
        self._server = await asyncio.start_server(self._accept, "127.0.0.1", self.port)

    async def refuse(self) -> None:
        self.mode = "refuse"
        await self._close_listener()
        self._reset_all()

    async def blackhole(self) -> None:
        self.mode = "blackhole"

    async def reopen(self) -> None:
        self._forgotten |= {client for client, _ in self._conns}
        self.mode = "pass"

    def _silent(self, client: asyncio.StreamWriter) -> bool:
        return self.mode == "blackhole" or client in self._forgotten

    async def partition(self) -> None:
        self.mode = "partition"

    async def heal(self) -> None:
        self.mode = "pass"

    async def _held(self, entry: tuple[asyncio.StreamWriter, asyncio.StreamWriter | None]) -> None:
        while self.mode == "partition" and entry in self._conns:
            await asyncio.sleep(0.02)

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
        self._forgotten.clear()
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
            while (self._silent(writer) or self.mode == "partition") and entry in self._conns:
                await asyncio.sleep(0.02)  # accepted, not connected upstream (yet)
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
            await self._held(entry)  # partitioned: held (no further read), then passed on
            if not data:
                break
            # Blackholed: the bytes are swallowed (the peer sees a silent, open connection).
            if not self._silent(entry[0]):
                writer.write(data)
                await writer.drain()
        if writer is entry[0] and writer in self._forgotten:
            return  # the server's close is dropped too: the client hears nothing, ever
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
