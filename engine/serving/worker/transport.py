"""The worker's message transport: one WebSocket per gateway on the worker's aiohttp server.

Each gateway holds one persistent connection per worker (``GET /v1/calls``, upgraded; TCP, or
the Unix socket of the local worker of ``kvgate serve``) and multiplexes its calls over it, each
named by a ``call`` id (engine/remote/messages.py), one binary message per frame::

    gateway --Generate/Pin/Unpin/Forget/Load/Abort/Subscribe/Cancel--> worker
    gateway <--Output.../Failed/Done/Pinned/Forgot/Loaded/Events---- (by call id)

Why a WebSocket on the event loop and not a message library with threads of its own: a frame is
written and read by the loops at either end, with no I/O thread to wake on each side, which on a
worker whose engine threads hold the cores is most of a message's cost (bench/results/
transport.json: ZeroMQ beside this, one run).

- Admission: the upgrade is a ``/v1/`` request, so the token middleware admits only
  ``Authorization: Bearer <KVGATE_WORKER_TOKEN>`` (constant time; engine/serving/worker/server.py).
- A generate call sends nothing until the request's first output, so a caller that has seen no
  ``Output`` knows nothing was generated. A refusal is one ``Failed`` (a malformed message is a
  ``ValueError`` for its call; a message naming no call is dropped, logged): the worker never
  fails on a bad frame.
- A caller that leaves sends ``Cancel``: the call's task is cancelled, which leaves the engine
  stream, aborting the request and freeing its blocks; a pin whose caller left is released.
- Backpressure: a send waits while the connection's write buffer is full (a gateway that reads
  slowly), so that gateway's calls stop reading their engine streams; other gateways' connections
  are not held up.
- Peer death: a closed connection (the process died) ends every call of that connection at
  once; heartbeats (``HEARTBEAT_S``) close one whose peer stops answering.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Awaitable, Callable

from aiohttp import WSMsgType, web

from engine.core.kv import PinHandle
from engine.errors import EngineError
from engine.outputs import RequestOutput
from engine.remote import messages as m
from engine.remote.messages import CALLS_PATH, HEARTBEAT_S, MAX_MESSAGE_BYTES
from engine.serving.worker.state import WORKER, WorkerState

log = logging.getLogger(__name__)
_SENT = (ConnectionResetError, ConnectionError, RuntimeError)  # a send on a closed connection


class PeerGone(ConnectionError):
    """The gateway that made the call is no longer connected."""


def add_transport(app: web.Application) -> None:
    """Serve the transport on ``app`` (the worker's probe app: one server, one port)."""
    app.router.add_get(CALLS_PATH, _connection)


async def _connection(request: web.Request) -> web.WebSocketResponse:
    ws = web.WebSocketResponse(
        heartbeat=HEARTBEAT_S, max_msg_size=MAX_MESSAGE_BYTES, compress=False, autoping=True
    )
    await ws.prepare(request)
    peer = Peer(request.app[WORKER], ws)
    try:
        async for msg in ws:
            if msg.type is WSMsgType.BINARY:
                peer.received(msg.data)
            else:  # text frames are not part of the protocol
                log.warning("worker transport: dropped a %s frame", msg.type.name)
    finally:
        await peer.close()
    return ws


class Peer:
    """One gateway's connection: its calls in flight, keyed by call id."""

    def __init__(self, state: WorkerState, ws: web.WebSocketResponse) -> None:
        self.state = state
        self._ws = ws
        self._calls: dict[int, asyncio.Task[None]] = {}

    async def close(self) -> None:
        """The connection ended: cancel every call in flight (their requests are aborted)."""
        tasks = list(self._calls.values())
        for task in tasks:
            task.cancel()
        for task in tasks:
            with contextlib.suppress(BaseException):
                await task

    # -- receiving --------------------------------------------------------------------------
    def received(self, data: bytes) -> None:
        try:
            msg = m.decode_request(data)
        except m.WireError as exc:
            self._refuse(data, exc)
            return
        if isinstance(msg, m.Cancel):
            task = self._calls.get(msg.call)
            if task is not None:
                task.cancel()
            return
        self._spawn(msg.call, _HANDLERS[type(msg)](self, msg))

    def _refuse(self, data: bytes, exc: m.WireError) -> None:
        call = m.call_of(data)
        if call is None:
            log.warning("worker transport: dropped a message naming no call (%s)", exc)
            return
        bad = m.ErrorInfo.of(ValueError(str(exc)))
        self._spawn(call, self.send(m.Failed(call, bad)))

    def _spawn(self, call: int, work: Awaitable[None]) -> None:
        async def run() -> None:
            try:
                await work
            except (PeerGone, asyncio.CancelledError):
                pass
            except Exception:  # a bug: this call fails, the worker goes on
                log.exception("worker transport: call %d failed", call)

        task = asyncio.get_running_loop().create_task(run())
        old = self._calls.get(call)
        if old is not None:  # a call id reused while in flight: the newer one wins
            old.cancel()
        self._calls[call] = task
        task.add_done_callback(lambda done: self._forget(call, done))

    def _forget(self, call: int, task: asyncio.Task[None]) -> None:
        if self._calls.get(call) is task:
            del self._calls[call]

    # -- sending ----------------------------------------------------------------------------
    async def send(self, msg: m.Reply) -> None:
        """Write ``msg``; waits while this gateway's write buffer is full."""
        if self._ws.closed:
            raise PeerGone("the gateway is gone")
        try:
            await self._ws.send_bytes(m.encode(msg))
        except _SENT:
            raise PeerGone("the gateway is gone") from None


async def _generate(p: Peer, msg: m.Generate) -> None:
    """The request's frames, from its first output on (nothing before it)."""
    state, call, rid = p.state, msg.call, msg.options.request_id
    if rid is None:
        bad = ValueError("bad generate request: no request id")
        await p.send(m.Failed(call, m.ErrorInfo.of(bad)))
        return
    stream = state.engine.generate(msg.token_ids, msg.params, msg.options)
    state.load.add(rid, len(msg.token_ids), msg.params.max_tokens)
    first = True
    try:
        while True:
            try:
                out = await anext(stream)
            except (EngineError, ValueError) as exc:  # refused, or the engine stopped under it
                await p.send(m.Failed(call, m.ErrorInfo.of(exc)))
                return
            if not out.finished:
                state.load.advance(rid, len(out.token_ids))
            await p.send(output_frame(call, out, first=first))
            if out.finished:
                return
            first = False
    finally:
        state.load.finish(rid)
        await stream.aclose()  # a stream left early aborts the request


def output_frame(call: int, out: RequestOutput, *, first: bool) -> m.Output:
    lp = list(out.new_logprobs) if out.new_logprobs is not None else None
    if not (first or out.finished):
        return m.Output(call, list(out.new_token_ids), lp)
    err = m.ErrorInfo.of(out.error) if out.error is not None else None
    return m.Output(
        call,
        list(out.new_token_ids),
        lp,
        cached=out.num_cached_tokens,
        metrics=out.metrics,
        finished=out.finished,
        finish_reason=out.finish_reason,
        token_ids=list(out.token_ids) if out.finished else None,
        error=err,
    )


async def _pin(p: Peer, msg: m.Pin) -> None:
    engine = p.state.engine
    pinning = asyncio.ensure_future(engine.pin_prefix(msg.namespace, msg.token_ids))
    try:
        handle = await asyncio.shield(pinning)
    except EngineError as exc:
        await p.send(m.Failed(msg.call, m.ErrorInfo.of(exc)))
        return
    except asyncio.CancelledError:  # the caller left: a pin nobody holds would never go away
        pinning.add_done_callback(lambda done: _release_orphan(p.state, done))
        raise
    try:
        await p.send(m.Pinned(msg.call, handle))
    except PeerGone:
        await engine.unpin(handle)
        raise


def _release_orphan(state: WorkerState, done: asyncio.Future[PinHandle]) -> None:
    if not done.cancelled() and done.exception() is None:
        task = asyncio.ensure_future(state.engine.unpin(done.result()))
        state.background.add(task)
        task.add_done_callback(state.background.discard)


async def _unpin(p: Peer, msg: m.Unpin) -> None:
    try:
        await p.state.engine.unpin(msg.handle)
    except (EngineError, KeyError, ValueError, AssertionError) as exc:
        failed = m.ErrorInfo.of(EngineError(f"unpin failed: {exc}"))
        await p.send(m.Failed(msg.call, failed))
        return
    await p.send(m.Done(msg.call))


async def _forget(p: Peer, msg: m.Forget) -> None:
    try:
        removed = await p.state.engine.forget_namespace(msg.namespace)
    except OSError as exc:
        failed = m.ErrorInfo.of(EngineError(f"forget failed: {exc.strerror}"))
        await p.send(m.Failed(msg.call, failed))
        return
    await p.send(m.Forgot(msg.call, removed))


async def _abort(p: Peer, msg: m.Abort) -> None:
    await p.state.engine.abort(msg.request_id)
    await p.send(m.Done(msg.call))


async def _load(p: Peer, msg: m.Load) -> None:
    await p.send(m.Loaded(msg.call, p.state.load_report()))


async def _subscribe(p: Peer, msg: m.Subscribe) -> None:
    """KV event batches until the caller cancels (or falls too far behind: EventsEnd)."""
    hub = p.state.events
    q = hub.subscribe()
    try:
        await p.send(m.Events(msg.call, []))  # subscribed from here on
        while (batch := await q.get()) is not None:
            await p.send(m.Events(msg.call, batch))
        await p.send(m.EventsEnd(msg.call))
    finally:
        hub.unsubscribe(q)


_HANDLERS: dict[type[m.Request], Callable[..., Awaitable[None]]] = {
    m.Generate: _generate,
    m.Pin: _pin,
    m.Unpin: _unpin,
    m.Forget: _forget,
    m.Abort: _abort,
    m.Load: _load,
    m.Subscribe: _subscribe,
}
