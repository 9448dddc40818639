"""``WorkerChannel``: this gateway's one connection to a worker's transport (a WebSocket).

Every call to the worker (engine/serving/worker/transport.py) is multiplexed over it, named by a
call id; the connection's reader hands each reply to its call's queue. The connection is opened
by the first call that needs it and again by the first call after it dropped::

    connected            calls go out at once
    dropped              every call of that connection ends with ``LOST`` (the worker died, or
                         stopped answering heartbeats); the next call connects again
    refused              nothing accepts connections there now (``WorkerUnavailable.refused``)
    denied               the worker refused the upgrade (another token, or not a kvgate worker)

A call made while the channel is not connected waits for the connection up to ``connect_s``:
``WorkerUnavailable``, nothing was sent.
"""

from __future__ import annotations

import asyncio
import contextlib
import itertools
from collections.abc import AsyncGenerator, Callable
from dataclasses import dataclass, field
from typing import Final

import aiohttp
from aiohttp import WSMsgType

from engine.errors import EngineDead
from engine.remote import messages as m
from engine.remote.messages import CALLS_PATH, HEARTBEAT_S, MAX_MESSAGE_BYTES


class WorkerUnavailable(EngineDead):
    """The worker could not take the call (nothing was generated). ``refused``: nothing
    listens there (the process is gone), as opposed to a call that timed out (maybe busy)."""

    def __init__(self, message: str, *, refused: bool = False) -> None:
        super().__init__(message)
        self.refused = refused


class _LostType:
    """Put into a call's queue when the connection dropped under it."""


LOST: Final = _LostType()
_Item = m.Reply | _LostType


@dataclass
class _Connection:
    ws: aiohttp.ClientWebSocketResponse
    calls: dict[int, asyncio.Queue[_Item]] = field(default_factory=dict)

    def fail_all(self) -> None:
        for q in self.calls.values():
            q.put_nowait(LOST)
        self.calls.clear()


class WorkerChannel:
    def __init__(
        self,
        url: str,
        token: str,
        session: aiohttp.ClientSession | None = None,
        *,
        unix_path: str | None = None,  # the local worker's socket: its own session
        connect_s: float = 5.0,
    ) -> None:
        self.endpoint = f"unix:{unix_path}" if unix_path is not None else url
        self._url = url.rstrip("/") + CALLS_PATH
        self._headers = {"Authorization": f"Bearer {token}"}
        self._session = session
        self._unix_path = unix_path
        self._own_session: aiohttp.ClientSession | None = None
        self._connect_s = connect_s
        self._ids = itertools.count(1)
        self._conn: _Connection | None = None
        self._lock = asyncio.Lock()
        self._readers: set[asyncio.Task[None]] = set()
        self._notices: set[asyncio.Task[None]] = set()  # Cancel sends in flight
        self.refused = False  # the latest connection attempt was refused (nothing listens)
        self.denied = False  # the worker refused the upgrade (a different token)
        self._closed = False

    # -- connection -------------------------------------------------------------------------
    @property
    def connected(self) -> bool:
        return self._conn is not None and not self._conn.ws.closed

    async def _ready(self) -> _Connection:
        if self._closed:
            raise WorkerUnavailable("the channel is closed")
        conn = self._conn
        if conn is not None and not conn.ws.closed:
            return conn
        async with self._lock:  # one connection attempt at a time; the others wait for it
            conn = self._conn
            if conn is None or conn.ws.closed:
                conn = self._conn = await self._connect()
        return conn

    def _client(self) -> aiohttp.ClientSession:
        if self._unix_path is None and self._session is not None:
            return self._session
        if self._own_session is None:
            connector = (
                aiohttp.UnixConnector(self._unix_path) if self._unix_path is not None else None
            )
            self._own_session = aiohttp.ClientSession(connector=connector)
        return self._own_session

    async def _connect(self) -> _Connection:
        try:
            async with asyncio.timeout(self._connect_s):
                ws = await self._client().ws_connect(
                    self._url,
                    headers=self._headers,
                    heartbeat=HEARTBEAT_S,
                    max_msg_size=MAX_MESSAGE_BYTES,
                    compress=0,
                )
        except aiohttp.WSServerHandshakeError as exc:  # a 401, or not a kvgate worker
            self.denied, self.refused = True, False
            why = f"worker {self.endpoint}: upgrade refused ({exc.status})"
            raise WorkerUnavailable(why) from None
        except (aiohttp.ClientConnectorError, ConnectionRefusedError, FileNotFoundError):
            self.refused = True
            raise WorkerUnavailable(
                f"worker {self.endpoint}: connection refused", refused=True
            ) from None
        except (TimeoutError, aiohttp.ClientError, OSError) as exc:
            raise WorkerUnavailable(
                f"worker {self.endpoint}: connection failed ({type(exc).__name__})"
            ) from None
        self.refused = self.denied = False
        conn = _Connection(ws)
        reader = asyncio.get_running_loop().create_task(self._read(conn))
        self._readers.add(reader)
        reader.add_done_callback(self._readers.discard)
        return conn

    async def _read(self, conn: _Connection) -> None:
        """Hand every reply to its call until the connection ends; then its calls are LOST."""
        try:
            async for msg in conn.ws:
                if msg.type is not WSMsgType.BINARY:
                    break  # an error frame: the connection is not usable
                self._deliver(conn, msg.data)
        finally:
            conn.fail_all()
            if not conn.ws.closed:
                await conn.ws.close()

    @staticmethod
    def _deliver(conn: _Connection, data: bytes) -> None:
        try:
            reply = m.decode_reply(data)
        except m.WireError:  # a worker of another version: its calls fail by timeout
            return
        q = conn.calls.get(reply.call)
        if q is not None:  # else: the call was left (a late reply)
            q.put_nowait(reply)

    # -- calls ------------------------------------------------------------------------------
    async def _open(
        self, make: Callable[[int], m.Request]
    ) -> tuple[_Connection, int, asyncio.Queue[_Item]]:
        conn = await self._ready()
        call = next(self._ids)
        q: asyncio.Queue[_Item] = asyncio.Queue()
        conn.calls[call] = q
        try:
            await conn.ws.send_bytes(m.encode(make(call)))
        except (ConnectionError, RuntimeError) as exc:  # closed under us: nothing was sent
            conn.calls.pop(call, None)
            raise WorkerUnavailable(f"worker {self.endpoint}: send failed ({exc})") from None
        return conn, call, q

    def _leave(self, conn: _Connection, call: int) -> None:
        """Forget the call and tell the worker (best effort: a closed connection has ended the
        call on the worker already)."""
        if conn.calls.pop(call, None) is None or conn.ws.closed:
            return
        notice = asyncio.get_running_loop().create_task(self._cancel(conn, call))
        self._notices.add(notice)
        notice.add_done_callback(self._notices.discard)

    @staticmethod
    async def _cancel(conn: _Connection, call: int) -> None:
        with contextlib.suppress(ConnectionError, RuntimeError):
            await conn.ws.send_bytes(m.encode(m.Cancel(call)))

    async def request(self, make: Callable[[int], m.Request], timeout_s: float) -> m.Reply:
        """One reply; WorkerUnavailable when none came in ``timeout_s`` or the connection
        dropped (the call is cancelled on the worker); a ``Failed`` reply raises its error."""
        conn, call, q = await self._open(make)
        try:
            async with asyncio.timeout(timeout_s):
                item = await q.get()
            conn.calls.pop(call, None)  # answered: nothing to cancel
        except TimeoutError:
            raise WorkerUnavailable(f"worker {self.endpoint}: no reply in {timeout_s} s") from None
        finally:
            self._leave(conn, call)
        if isinstance(item, _LostType):
            raise WorkerUnavailable(f"worker {self.endpoint}: connection lost")
        if isinstance(item, m.Failed):
            raise item.error.rebuild()
        return item

    async def stream(self, make: Callable[[int], m.Request]) -> AsyncGenerator[_Item, None]:
        """Every reply of a streamed call (``LOST`` last if the connection drops) until the
        caller stops iterating; leaving cancels the call on the worker."""
        conn, call, q = await self._open(make)
        try:
            while True:
                item = await q.get()
                ended = _ends(item)
                if ended:
                    conn.calls.pop(call, None)  # the worker ended the call: nothing to cancel
                yield item
                if ended:
                    return
        finally:
            self._leave(conn, call)

    async def close(self) -> None:
        if self._closed:
            return
        self._closed = True
        conn, self._conn = self._conn, None
        if conn is not None:
            await conn.ws.close()
            conn.fail_all()
        for task in [*self._readers, *self._notices]:
            task.cancel()
        for task in [*self._readers, *self._notices]:
            with contextlib.suppress(asyncio.CancelledError):
                await task
        if self._own_session is not None:
            await self._own_session.close()


def _ends(item: _Item) -> bool:
    """The last message of a streamed call."""
    if isinstance(item, m.Output):
        return item.finished
    return isinstance(item, _LostType | m.Failed | m.EventsEnd)
