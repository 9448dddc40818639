"""The worker's message transport: one ZeroMQ ROUTER socket, every gateway a DEALER on it.

Each gateway holds one persistent connection per worker (TCP, or ``ipc://`` for the local worker
of ``kvgate serve``) and multiplexes its calls over it, each named by a ``call`` id
(engine/worker/messages.py)::

    gateway DEALER --Generate/Pin/Unpin/Forget/Load/Abort/Subscribe/Cancel--> worker ROUTER
    gateway DEALER <--Output.../Failed/Done/Pinned/Forgot/Loaded/Events---- (by call id)

Rules kept from the HTTP protocol before it:

- CURVE, keys derived from ``KVGATE_WORKER_TOKEN`` (engine/worker/curve.py): the ZAP handler
  admits only the token's client key (constant time), and every frame is encrypted.
- A generate call sends nothing until the request's first output, so a caller that has seen no
  ``Output`` knows nothing was generated. A refusal is one ``Failed`` (a malformed message is a
  ``ValueError`` for its call; a message naming no call is dropped, logged): the worker never
  fails on a bad frame.
- A caller that leaves sends ``Cancel``: the call's task is cancelled, which leaves the engine
  stream, aborting the request and freeing its blocks; a pin whose caller left is released.
- Backpressure: a gateway's queue on this socket is bounded (``SNDHWM`` messages). When it is
  full the calls of that gateway wait (``_send`` retries) and stop reading their engine streams;
  other gateways are not held up. A gateway that is gone (``EHOSTUNREACH``) ends its calls.
- Peer death: ZMTP heartbeats (``HEARTBEAT_*``) close a connection whose peer stops answering;
  the gateway side sees the disconnect and ends that worker's streams (gateway/cluster/channel.py).
  A gateway that dies is found at the next frame sent to it (``EHOSTUNREACH``): its requests are
  aborted then (an ``interim=False`` request runs to its end first, as it sends nothing before).
"""

from __future__ import annotations

import asyncio
import contextlib
import errno
import logging
from collections.abc import Awaitable, Callable

import zmq
import zmq.asyncio
from zmq.auth.asyncio import AsyncioAuthenticator

from engine.errors import EngineError
from engine.kv import PinHandle
from engine.outputs import RequestOutput
from engine.worker import messages as m
from engine.worker.curve import CurveKeys, curve_keys
from engine.worker.server import WorkerState

log = logging.getLogger(__name__)
SNDHWM = 10_000  # messages queued to one gateway before its calls wait
HEARTBEAT_IVL_MS = 1_000
HEARTBEAT_TIMEOUT_MS = 5_000  # no answer to a heartbeat for this long: the peer is gone
ZAP_DOMAIN = "kvgate"
_Key = tuple[bytes, int]  # (gateway identity, call)


class PeerGone(ConnectionError):
    """The gateway that made the call is no longer connected."""


class _Admit:
    """ZAP credentials provider: the token's client key, nothing else."""

    def __init__(self, keys: CurveKeys) -> None:
        self._keys = keys

    def callback(self, domain: str, key: bytes) -> bool:
        return self._keys.admits(key)


def configure_heartbeats(sock: zmq.asyncio.Socket) -> None:
    sock.setsockopt(zmq.HEARTBEAT_IVL, HEARTBEAT_IVL_MS)
    sock.setsockopt(zmq.HEARTBEAT_TIMEOUT, HEARTBEAT_TIMEOUT_MS)
    sock.setsockopt(zmq.HEARTBEAT_TTL, HEARTBEAT_TIMEOUT_MS)


class WorkerTransport:
    def __init__(self, state: WorkerState) -> None:
        self.state = state
        self._keys = curve_keys(state.token)
        self._ctx = zmq.asyncio.Context()
        self._auth: AsyncioAuthenticator | None = None
        self._sock: zmq.asyncio.Socket | None = None
        self._out: zmq.Socket[bytes] | None = None
        self._loop: asyncio.AbstractEventLoop | None = None
        self._calls: dict[_Key, asyncio.Task[None]] = {}

    async def start(self, endpoints: list[str]) -> int | None:
        """Bind ``endpoints`` (``tcp://host:port``, ``ipc://path``); the bound TCP port."""
        self._auth = AsyncioAuthenticator(self._ctx)
        self._auth.start()
        self._auth.configure_curve_callback(ZAP_DOMAIN, credentials_provider=_Admit(self._keys))
        sock = self._ctx.socket(zmq.ROUTER)
        sock.setsockopt(zmq.LINGER, 0)
        sock.setsockopt(zmq.ROUTER_MANDATORY, 1)  # refuse, never drop, what cannot be queued
        sock.setsockopt(zmq.SNDHWM, SNDHWM)
        sock.setsockopt_string(zmq.ZAP_DOMAIN, ZAP_DOMAIN)
        sock.curve_server = True
        sock.curve_secretkey = self._keys.server_secret
        sock.curve_publickey = self._keys.server_public
        configure_heartbeats(sock)
        port = None
        for endpoint in endpoints:
            sock.bind(endpoint)
            if endpoint.startswith("tcp://") and port is None:
                last = sock.getsockopt_string(zmq.LAST_ENDPOINT)
                port = int(last.rsplit(":", 1)[1])
        self._sock = sock
        # a plain (non-asyncio) handle of the same socket: sends never wait (NOBLOCK) and
        # messages are read by a reader callback on its FD, so a frame costs no future and no
        # task switch. The FD is edge-triggered: drained until EAGAIN, and after each send
        # (which may consume the edge).
        self._out = zmq.Socket.shadow(sock.underlying)
        self._loop = asyncio.get_running_loop()
        self._loop.add_reader(self._out.FD, self._drain)
        self._loop.call_soon(self._drain)
        return port

    async def close(self) -> None:
        """Stop receiving and cancel every call in flight (their requests are aborted)."""
        if self._ctx.closed:
            return
        if self._loop is not None and self._out is not None:
            self._loop.remove_reader(self._out.FD)
        tasks = list(self._calls.values())
        for task in tasks:
            task.cancel()
        for task in tasks:
            with contextlib.suppress(BaseException):
                await task
        if self._auth is not None:
            self._auth.stop()
        self._ctx.destroy(linger=0)

    # -- receiving --------------------------------------------------------------------------
    def _drain(self) -> None:
        out = self._out
        while out is not None and not out.closed and m.readable(out):
            try:
                frames = out.recv_multipart(zmq.NOBLOCK)
            except zmq.Again:
                return
            self._received(frames)

    def _received(self, frames: list[bytes]) -> None:
        if len(frames) != 2:
            log.warning("worker transport: dropped a message of %d frames", len(frames))
            return
        peer, data = frames
        try:
            msg = m.decode_request(data)
        except m.WireError as exc:
            self._refuse(peer, data, exc)
            return
        self._dispatch(peer, msg)

    def _refuse(self, peer: bytes, data: bytes, exc: m.WireError) -> None:
        call = m.call_of(data)
        if call is None:
            log.warning("worker transport: dropped a message naming no call (%s)", exc)
            return
        bad = m.ErrorInfo.of(ValueError(str(exc)))
        self._spawn(peer, call, self._send(peer, m.Failed(call, bad)))

    def _dispatch(self, peer: bytes, msg: m.Request) -> None:
        if isinstance(msg, m.Cancel):
            task = self._calls.get((peer, msg.call))
            if task is not None:
                task.cancel()
            return
        self._spawn(peer, msg.call, self._handle(peer, msg))

    def _spawn(self, peer: bytes, call: int, work: Awaitable[None]) -> None:
        key = (peer, call)

        async def run() -> None:
            try:
                await work
            except (PeerGone, asyncio.CancelledError):
                pass
            except Exception:  # a bug: this call fails, the worker goes on
                log.exception("worker transport: call %d failed", call)

        task = asyncio.get_running_loop().create_task(run())
        old = self._calls.get(key)
        if old is not None:  # a call id reused while in flight: the newer one wins
            old.cancel()
        self._calls[key] = task
        task.add_done_callback(lambda done: self._forget(key, done))

    def _forget(self, key: _Key, task: asyncio.Task[None]) -> None:
        if self._calls.get(key) is task:
            del self._calls[key]

    async def _handle(self, peer: bytes, msg: m.Request) -> None:
        await _HANDLERS[type(msg)](self, peer, msg)

    # -- sending ----------------------------------------------------------------------------
    async def _send(self, peer: bytes, msg: m.Reply) -> None:
        """Queue ``msg`` for ``peer``; waits while that gateway's queue is full."""
        assert self._out is not None
        frames = [peer, m.encode(msg)]
        delay = 0.0005
        while True:
            try:
                self._out.send_multipart(frames, flags=zmq.NOBLOCK)
                self._drain()
                return
            except zmq.Again:  # this gateway's queue is full: its calls wait, others go on
                await asyncio.sleep(delay)
                delay = min(2 * delay, 0.05)
            except zmq.ZMQError as exc:
                if exc.errno == errno.EHOSTUNREACH:
                    raise PeerGone("the gateway is gone") from None
                raise


async def _generate(t: WorkerTransport, peer: bytes, msg: m.Generate) -> None:
    """The request's frames, from its first output on (nothing before it)."""
    state, call, rid = t.state, msg.call, msg.options.request_id
    if rid is None:
        bad = ValueError("bad generate request: no request id")
        await t._send(peer, m.Failed(call, m.ErrorInfo.of(bad)))
        return
    stream = state.engine.generate(msg.token_ids, msg.params, msg.options)
    state.load.add(rid, len(msg.token_ids), msg.params.max_tokens)
    first = True
    try:
        while True:
            try:
                out = await anext(stream)
            except (EngineError, ValueError) as exc:  # refused, or the engine stopped under it
                await t._send(peer, m.Failed(call, m.ErrorInfo.of(exc)))
                return
            if not out.finished:
                state.load.advance(rid, len(out.token_ids))
            await t._send(peer, output_frame(call, out, first=first))
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


async def _pin(t: WorkerTransport, peer: bytes, msg: m.Pin) -> None:
    engine = t.state.engine
    pinning = asyncio.ensure_future(engine.pin_prefix(msg.namespace, msg.token_ids))
    try:
        handle = await asyncio.shield(pinning)
    except EngineError as exc:
        await t._send(peer, m.Failed(msg.call, m.ErrorInfo.of(exc)))
        return
    except asyncio.CancelledError:  # the caller left: a pin nobody holds would never go away
        pinning.add_done_callback(lambda done: _release_orphan(t.state, done))
        raise
    try:
        await t._send(peer, m.Pinned(msg.call, handle))
    except PeerGone:
        await engine.unpin(handle)
        raise


def _release_orphan(state: WorkerState, done: asyncio.Future[PinHandle]) -> None:
    if not done.cancelled() and done.exception() is None:
        task = asyncio.ensure_future(state.engine.unpin(done.result()))
        state.background.add(task)
        task.add_done_callback(state.background.discard)


async def _unpin(t: WorkerTransport, peer: bytes, msg: m.Unpin) -> None:
    try:
        await t.state.engine.unpin(msg.handle)
    except (EngineError, KeyError, ValueError, AssertionError) as exc:
        failed = m.ErrorInfo.of(EngineError(f"unpin failed: {exc}"))
        await t._send(peer, m.Failed(msg.call, failed))
        return
    await t._send(peer, m.Done(msg.call))


async def _forget(t: WorkerTransport, peer: bytes, msg: m.Forget) -> None:
    try:
        removed = await t.state.engine.forget_namespace(msg.namespace)
    except OSError as exc:
        failed = m.ErrorInfo.of(EngineError(f"forget failed: {exc.strerror}"))
        await t._send(peer, m.Failed(msg.call, failed))
        return
    await t._send(peer, m.Forgot(msg.call, removed))


async def _abort(t: WorkerTransport, peer: bytes, msg: m.Abort) -> None:
    await t.state.engine.abort(msg.request_id)
    await t._send(peer, m.Done(msg.call))


async def _load(t: WorkerTransport, peer: bytes, msg: m.Load) -> None:
    await t._send(peer, m.Loaded(msg.call, t.state.load_report()))


async def _subscribe(t: WorkerTransport, peer: bytes, msg: m.Subscribe) -> None:
    """KV event batches until the caller cancels (or falls too far behind: EventsEnd)."""
    hub = t.state.events
    q = hub.subscribe()
    try:
        await t._send(peer, m.Events(msg.call, []))  # subscribed from here on
        while (batch := await q.get()) is not None:
            await t._send(peer, m.Events(msg.call, batch))
        await t._send(peer, m.EventsEnd(msg.call))
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
