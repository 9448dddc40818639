"""The worker's internal API: one ``AsyncEngine`` served over HTTP/1.1 to gateways.

Every ``/v1/*`` route requires ``Authorization: Bearer <KVGATE_WORKER_TOKEN>`` (compared in
constant time); ``/healthz`` answers without it (orchestrator probes) and says nothing else::

    POST /v1/generate   {ids, params, ns, rid, prio?, interim?, scope?} -> frames (wire.py)
    POST /v1/abort      {rid}
    POST /v1/pin        {ns, ids} -> pin handle            POST /v1/unpin  {handle}
    POST /v1/forget     {ns} -> {removed}: the namespace's disk snapshot is deleted (tenant gone)
    GET  /v1/info       worker id, geometry, pin budget    GET  /v1/tokenizer  tokenizer payload
    GET  /v1/load       cache stats + requests waiting / running, outstanding tokens
    GET  /v1/events     stream of KV event batches (one JSON array per line)

A generate call (``serve_generate``) waits for the request's first output before sending the
response head, so a caller that sees no head knows nothing was generated (it may retry
elsewhere). The head goes out with the first frame, and the last frame with the chunked end, each
in one write. A caller that goes away cancels the call, which leaves the engine stream and so
aborts the request and frees its blocks. Gateways' generate connections are served by
engine/worker/fastpath.py in front of this aiohttp application; the route here serves generate
calls on connections aiohttp holds (any other client).
"""

from __future__ import annotations

import asyncio
import contextlib
import hmac
import uuid
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Protocol

import msgspec
from aiohttp import web

from engine.api import GenerateOptions
from engine.errors import EngineError
from engine.worker import wire
from engine.worker.events import KvEventHub
from engine.worker.load import LoadTracker
from engine.worker.messages import PROTOCOL, TokenizerPayload, WorkerInfo, WorkerLoad, to_json

if TYPE_CHECKING:
    from engine.async_engine import AsyncEngine

EVENT_INTERVAL_S = 0.05
MAX_BODY = 64 << 20  # request bodies (prompts of token ids) up to this many bytes
NDJSON = "application/x-ndjson"
Handler = Callable[[web.Request], Awaitable[web.StreamResponse]]


@dataclass
class WorkerState:
    engine: AsyncEngine
    info: WorkerInfo  # transport_port is set once the transport is bound (engine/worker/main.py)
    events: KvEventHub
    load: LoadTracker
    token: str = field(repr=False, default="")  # what callers present (KVGATE_WORKER_TOKEN)
    background: set[asyncio.Task[Any]] = field(default_factory=set)  # orphan unpins

    def load_report(self) -> WorkerLoad:
        snap = self.load.snapshot()
        return WorkerLoad(
            healthy=bool(self.engine.is_running),
            boot_id=self.info.boot_id,
            running=snap["running"],
            waiting=snap["waiting"],
            outstanding_tokens=snap["outstanding_tokens"],
            served=snap["served"],
            stats=self.engine.cache_stats(),
        )


WORKER = web.AppKey("worker", WorkerState)


def token_middleware(token: str) -> Any:
    expected = f"Bearer {token}".encode()

    @web.middleware
    async def check(request: web.Request, handler: Handler) -> web.StreamResponse:
        if request.path.startswith("/v1/"):
            given = request.headers.get("Authorization", "").encode()
            if not token or not hmac.compare_digest(given, expected):
                return web.json_response({"error": "unauthorized"}, status=401)
        return await handler(request)

    return check


def create_worker_app(
    engine: AsyncEngine, events: KvEventHub, token: str, worker_id: str
) -> web.Application:
    """``engine``: an AsyncEngine (not started) built with ``events`` as its cache listener."""
    if not token:
        raise ValueError("a worker needs a token (KVGATE_WORKER_TOKEN)")
    app = web.Application(middlewares=[token_middleware(token)], client_max_size=MAX_BODY)
    stats = engine.cache_stats()
    info = WorkerInfo(
        worker_id=worker_id,
        boot_id=uuid.uuid4().hex,
        block_size=int(engine.config.block_size),
        max_model_len=int(engine.max_model_len),
        blocks_total=stats.blocks_total,
        pin_budget_blocks=int(stats.blocks_total * engine.config.pin_cap_fraction),
        transport_port=0,
        protocol=PROTOCOL,
    )
    app[WORKER] = WorkerState(engine, info, events, LoadTracker(), token)
    app.cleanup_ctx.append(_lifecycle)
    app.router.add_get("/healthz", _healthz)
    app.router.add_get("/v1/info", _info)
    app.router.add_get("/v1/tokenizer", _tokenizer)
    app.router.add_get("/v1/load", _load)
    app.router.add_get("/v1/events", _events)
    app.router.add_post("/v1/generate", _generate)
    app.router.add_post("/v1/abort", _abort)
    app.router.add_post("/v1/pin", _pin)
    app.router.add_post("/v1/unpin", _unpin)
    app.router.add_post("/v1/forget", _forget)
    return app


async def _lifecycle(app: web.Application) -> Any:
    state = app[WORKER]
    await state.engine.start()
    pump = asyncio.get_running_loop().create_task(state.events.run(EVENT_INTERVAL_S))
    yield
    pump.cancel()
    with contextlib.suppress(asyncio.CancelledError):
        await pump
    await state.engine.shutdown()


async def _json_body(request: web.Request) -> dict[str, Any]:
    try:
        body = wire.decode(await request.read())
    except wire.WireError as exc:
        raise web.HTTPBadRequest(text=str(exc)) from None
    if not isinstance(body, dict):
        raise web.HTTPBadRequest(text="expected a JSON object")
    return body


def _reply(obj: Any, status: int = 200) -> web.Response:
    return web.Response(body=wire.encode(obj), status=status, content_type="application/json")


async def _healthz(request: web.Request) -> web.Response:
    ok = request.app[WORKER].engine.is_running
    return _reply({"status": "ok" if ok else "down"}, 200 if ok else 503)


def _json(body: bytes) -> web.Response:
    return web.Response(body=body, content_type="application/json")


async def _info(request: web.Request) -> web.Response:
    return _json(to_json(request.app[WORKER].info))


async def _tokenizer(request: web.Request) -> web.Response:
    return _json(to_json(TokenizerPayload.of(request.app[WORKER].engine.tokenizer)))


async def _load(request: web.Request) -> web.Response:
    return _json(msgspec.json.encode(request.app[WORKER].load_report()))


class GenerateSink(Protocol):
    """Where ``serve_generate`` sends its answer (the fast path's connection, or aiohttp)."""

    async def reply(self, status: int, body: bytes) -> None: ...  # one JSON answer

    async def frame(self, data: bytes) -> None: ...  # a stream frame (the first: with the head)

    async def last(self, data: bytes) -> None: ...  # the final frame and the end of the stream


async def serve_generate(state: WorkerState, raw: bytes, sink: GenerateSink) -> None:
    """One generate call: the request's frames, streamed from its first output on."""
    try:
        body = wire.decode(raw)
        ids = [int(t) for t in body["ids"]]
        params = wire.params_from_wire(body["params"])
        rid, ns = str(body["rid"]), str(body["ns"])
        prio = wire.priorities_from_wire(body.get("prio", []))
        interim = body.get("interim", True) is not False  # False: first and final frames only
        scope = wire.scope_from_wire(body.get("scope"))  # absent: the namespace alone
    except (wire.WireError, KeyError, TypeError, ValueError) as exc:
        bad = ValueError(f"bad generate request: {type(exc).__name__}: {exc}")
        await sink.reply(400, wire.encode({"e": wire.error_to_wire(bad)}))
        return
    options = GenerateOptions(ns, rid, prio, interim, scope)
    stream = state.engine.generate(ids, params, options)
    state.load.add(rid, len(ids), params.max_tokens)
    try:
        try:
            first = await anext(stream)
        except (EngineError, ValueError) as exc:
            await sink.reply(200, wire.encode({"e": wire.error_to_wire(exc)}))
            return
        out = first
        data = wire.frame(wire.output_to_wire(out, first=True))
        while not out.finished:
            state.load.advance(rid, len(out.token_ids))
            await sink.frame(data)
            try:
                out = await anext(stream)
            except (EngineError, ValueError) as exc:  # the engine stopped under the request
                data = wire.frame({"e": wire.error_to_wire(exc)})
                break
            data = wire.frame(wire.output_to_wire(out, first=False))
        await sink.last(data)
    finally:
        state.load.finish(rid)
        await stream.aclose()  # a stream left early aborts the request


class _AiohttpSink:
    def __init__(self, request: web.Request) -> None:
        self._request = request
        self.response: web.StreamResponse | None = None

    async def reply(self, status: int, body: bytes) -> None:
        self.response = web.Response(body=body, status=status, content_type="application/json")

    async def frame(self, data: bytes) -> None:
        await (await self._stream()).write(data)

    async def last(self, data: bytes) -> None:
        await (await self._stream()).write_eof(data)  # the last frame and the end in one write

    async def _stream(self) -> web.StreamResponse:
        if self.response is None:
            self.response = web.StreamResponse(headers={"Content-Type": NDJSON})
            await self.response.prepare(self._request)
        return self.response


async def _generate(request: web.Request) -> web.StreamResponse:
    """The generate route for connections aiohttp serves (engine/worker/fastpath.py serves
    the gateways' generate connections)."""
    sink = _AiohttpSink(request)
    await serve_generate(request.app[WORKER], await request.read(), sink)
    assert sink.response is not None, "serve_generate answers every call"
    return sink.response


async def _abort(request: web.Request) -> web.Response:
    body = await _json_body(request)
    await request.app[WORKER].engine.abort(str(body.get("rid", "")))
    return _reply({})


async def _pin(request: web.Request) -> web.Response:
    body = await _json_body(request)
    try:
        ns, ids = str(body["ns"]), [int(t) for t in body["ids"]]
    except (KeyError, TypeError, ValueError) as exc:
        return _reply({"e": wire.error_to_wire(ValueError(f"bad pin request: {exc}"))}, 400)
    state = request.app[WORKER]
    pinning = asyncio.ensure_future(state.engine.pin_prefix(ns, ids))
    try:
        handle = await asyncio.shield(pinning)
    except EngineError as exc:
        return _reply({"e": wire.error_to_wire(exc)})
    except asyncio.CancelledError:  # the caller left: a pin nobody holds would never go away
        pinning.add_done_callback(lambda done: _release_orphan(state, done))
        raise
    return _reply({"handle": wire.pin_to_wire(handle)})


def _release_orphan(state: WorkerState, done: asyncio.Future[Any]) -> None:
    if not done.cancelled() and done.exception() is None:
        task = asyncio.ensure_future(state.engine.unpin(done.result()))
        state.background.add(task)
        task.add_done_callback(state.background.discard)


async def _unpin(request: web.Request) -> web.Response:
    body = await _json_body(request)
    try:
        handle = wire.pin_from_wire(body["handle"])
    except (KeyError, TypeError, ValueError) as exc:
        return _reply({"e": wire.error_to_wire(ValueError(f"bad unpin request: {exc}"))}, 400)
    try:
        await request.app[WORKER].engine.unpin(handle)
    except (EngineError, KeyError, ValueError, AssertionError) as exc:
        return _reply({"e": wire.error_to_wire(EngineError(f"unpin failed: {exc}"))})
    return _reply({})


async def _forget(request: web.Request) -> web.Response:
    body = await _json_body(request)
    ns = body.get("ns")
    if not isinstance(ns, str):
        return _reply({"e": wire.error_to_wire(ValueError("bad forget request: no ns"))}, 400)
    try:
        removed = await request.app[WORKER].engine.forget_namespace(ns)
    except OSError as exc:
        return _reply({"e": wire.error_to_wire(EngineError(f"forget failed: {exc.strerror}"))})
    return _reply({"removed": removed})


async def _events(request: web.Request) -> web.StreamResponse:
    """KV event batches until the caller leaves (or falls too far behind: the stream ends)."""
    hub = request.app[WORKER].events
    q = hub.subscribe()
    resp = web.StreamResponse(headers={"Content-Type": NDJSON})
    try:
        await resp.prepare(request)
        await resp.write(b"[]\n")  # the head: subscribed from here on
        while (batch := await q.get()) is not None:
            await resp.write(msgspec.json.encode(batch) + b"\n")
    finally:
        hub.unsubscribe(q)
    return resp
