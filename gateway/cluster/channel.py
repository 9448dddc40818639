"""``WorkerChannel``: this gateway's one connection to a worker's transport (ZeroMQ DEALER).

Every call to the worker (engine/worker/transport.py) is multiplexed over it, named by a call
id; a reader callback on the socket's FD hands each reply to its call's queue. The connection's
state comes from a socket monitor (public pyzmq API): ZeroMQ reconnects by itself, tells no call::

    handshake succeeded      -> connected
    disconnected             -> every call in flight ends with ``Lost`` (the worker died, or
                                stopped answering heartbeats); ZeroMQ reconnects in the background
    connect retried / closed -> ``refused``: nothing accepts connections there now

A call made while the channel is not connected waits for the handshake up to ``connect_s``,
unless the worker refused us (then at once): ``WorkerUnavailable``, nothing was sent.
``ZMQ_IMMEDIATE`` keeps ZeroMQ from queueing messages for a connection that is not up.
"""

from __future__ import annotations

import asyncio
import contextlib
import itertools
from collections.abc import AsyncGenerator, Callable
from typing import Final

import zmq
import zmq.asyncio
from zmq.utils.monitor import parse_monitor_message

from engine.errors import EngineDead
from engine.worker import messages as m
from engine.worker.curve import curve_keys
from engine.worker.transport import configure_heartbeats

_EVENTS = (
    zmq.EVENT_HANDSHAKE_SUCCEEDED
    | zmq.EVENT_DISCONNECTED
    | zmq.EVENT_CONNECT_RETRIED
    | zmq.EVENT_CLOSED
    | zmq.EVENT_HANDSHAKE_FAILED_AUTH
    | zmq.EVENT_HANDSHAKE_FAILED_PROTOCOL
)


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

_context: zmq.asyncio.Context | None = None


def _shared_context() -> zmq.asyncio.Context:
    global _context
    if _context is None:  # one per process (its I/O thread serves every channel)
        _context = zmq.asyncio.Context()
    return _context


class WorkerChannel:
    def __init__(self, endpoint: str, token: str, connect_s: float = 5.0) -> None:
        self.endpoint = endpoint
        self._connect_s = connect_s
        keys = curve_keys(token)
        sock = _shared_context().socket(zmq.DEALER)
        sock.setsockopt(zmq.LINGER, 0)
        sock.setsockopt(zmq.IMMEDIATE, 1)
        sock.curve_serverkey = keys.server_public
        sock.curve_publickey = keys.client_public
        sock.curve_secretkey = keys.client_secret
        configure_heartbeats(sock)
        self._monitor = sock.get_monitor_socket(_EVENTS)
        sock.connect(endpoint)
        self._sock = sock
        self._raw: zmq.Socket[bytes] = zmq.Socket.shadow(sock.underlying)  # NOBLOCK: no futures
        self._ids = itertools.count(1)
        self._calls: dict[int, asyncio.Queue[_Item]] = {}
        self._tasks: list[asyncio.Task[None]] = []
        self._up = asyncio.Event()
        self._changed = asyncio.Event()  # set by every monitor event (wakes ``_ready``)
        self.refused = False  # the latest connection attempt was refused (nothing listens)
        self.denied = False  # the worker's handshake refused our keys (a different token)
        self._closed = False
        self._loop: asyncio.AbstractEventLoop | None = None

    # -- connection state -------------------------------------------------------------------
    def _ensure_tasks(self) -> None:
        if not self._tasks:
            loop = asyncio.get_running_loop()
            # replies are read by a reader callback on the socket's FD (edge-triggered: drained
            # until EAGAIN, and again after each send, which may consume the edge)
            loop.add_reader(self._raw.FD, self._drain)
            self._loop = loop
            self._tasks = [loop.create_task(self._watch())]
            loop.call_soon(self._drain)

    async def _watch(self) -> None:
        while True:
            event = parse_monitor_message(await self._monitor.recv_multipart())["event"]
            if event == zmq.EVENT_HANDSHAKE_SUCCEEDED:
                self.refused = self.denied = False
                self._up.set()
            elif event == zmq.EVENT_DISCONNECTED:
                self._up.clear()
                self._fail_all()
            elif event in (zmq.EVENT_CONNECT_RETRIED, zmq.EVENT_CLOSED):
                self.refused = not self._up.is_set()
            else:  # a handshake failed: another token, or not a kvgate worker
                self.denied = True
            self._changed.set()

    def _fail_all(self) -> None:
        for q in self._calls.values():
            q.put_nowait(LOST)

    async def _ready(self) -> None:
        if self._closed:
            raise WorkerUnavailable("the channel is closed")
        self._ensure_tasks()
        with contextlib.suppress(TimeoutError):
            async with asyncio.timeout(self._connect_s):
                while not (self._up.is_set() or self.refused or self.denied):
                    self._changed.clear()
                    await self._changed.wait()
        if self._up.is_set():
            return
        why = "refused" if self.refused else "denied our token" if self.denied else "timed out"
        raise WorkerUnavailable(f"worker {self.endpoint}: connection {why}", refused=self.refused)

    @property
    def connected(self) -> bool:
        return self._up.is_set()

    def _drain(self) -> None:
        """Hand every reply that has arrived to its call."""
        raw = self._raw
        while not self._closed and m.readable(raw):
            try:
                data = raw.recv(zmq.NOBLOCK)
            except zmq.Again:
                return
            self._deliver(data)

    def _deliver(self, data: bytes) -> None:
        try:
            reply = m.decode_reply(data)
        except m.WireError:  # a worker of another version: its calls fail by timeout
            return
        q = self._calls.get(reply.call)
        if q is not None:  # else: the call was left (a late reply)
            q.put_nowait(reply)

    # -- calls ------------------------------------------------------------------------------
    async def _open(self, make: Callable[[int], m.Request]) -> tuple[int, asyncio.Queue[_Item]]:
        await self._ready()
        call = next(self._ids)
        q: asyncio.Queue[_Item] = asyncio.Queue()
        self._calls[call] = q
        try:
            self._raw.send(m.encode(make(call)), flags=zmq.NOBLOCK)
        except zmq.ZMQError as exc:  # Again: not connected (any more), or our queue is full
            del self._calls[call]
            raise WorkerUnavailable(f"worker {self.endpoint}: send failed ({exc})") from None
        self._drain()
        return call, q

    def _leave(self, call: int) -> None:
        """Forget the call and tell the worker (best effort: a full queue drops the notice)."""
        if self._calls.pop(call, None) is not None and not self._closed:
            with contextlib.suppress(zmq.ZMQError):
                self._raw.send(m.encode(m.Cancel(call)), flags=zmq.NOBLOCK)
                self._drain()

    async def request(self, make: Callable[[int], m.Request], timeout_s: float) -> m.Reply:
        """One reply; WorkerUnavailable when none came in ``timeout_s`` or the connection
        dropped (the call is cancelled on the worker); a ``Failed`` reply raises its error."""
        call, q = await self._open(make)
        try:
            async with asyncio.timeout(timeout_s):
                item = await q.get()
            self._calls.pop(call, None)  # answered: nothing to cancel
        except TimeoutError:
            raise WorkerUnavailable(f"worker {self.endpoint}: no reply in {timeout_s} s") from None
        finally:
            self._leave(call)
        if isinstance(item, _LostType):
            raise WorkerUnavailable(f"worker {self.endpoint}: connection lost")
        if isinstance(item, m.Failed):
            raise item.error.rebuild()
        return item

    async def stream(self, make: Callable[[int], m.Request]) -> AsyncGenerator[_Item, None]:
        """Every reply of a streamed call (``LOST`` last if the connection drops) until the
        caller stops iterating; leaving cancels the call on the worker."""
        call, q = await self._open(make)
        try:
            while True:
                item = await q.get()
                ended = _ends(item)
                if ended:
                    self._calls.pop(call, None)  # the worker ended the call: nothing to cancel
                yield item
                if ended:
                    return
        finally:
            self._leave(call)

    async def close(self) -> None:
        if self._closed:
            return
        self._closed = True
        if self._loop is not None:
            self._loop.remove_reader(self._raw.FD)
        for task in self._tasks:
            task.cancel()
        for task in self._tasks:
            with contextlib.suppress(asyncio.CancelledError):
                await task
        self._fail_all()
        self._sock.disable_monitor()
        self._monitor.close(linger=0)
        self._sock.close(linger=0)


def _ends(item: _Item) -> bool:
    """The last message of a streamed call."""
    if isinstance(item, m.Output):
        return item.finished
    return isinstance(item, _LostType | m.Failed | m.EventsEnd)
