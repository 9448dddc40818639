"""The worker's aiohttp app: one ``AsyncEngine`` behind ``kvgate worker``, one port.

Gateways make their calls over the message transport (a WebSocket, engine/serving/worker/
transport.py); plain HTTP requests serve only what orchestrators and a starting gateway ask::

    GET /healthz        no token (orchestrator probes); says ok / down and nothing else
    GET /v1/info        WorkerInfo: worker id, boot id, geometry, pin budget, protocol digest
                        (engine/remote/messages.py)
    GET /v1/tokenizer   TokenizerPayload: what a gateway rebuilds the tokenizer from
    GET /v1/calls       the message transport (WebSocket upgrade)

Every ``/v1/*`` path requires ``Authorization: Bearer <KVGATE_WORKER_TOKEN>`` (compared in
constant time), answered 401 otherwise whether or not the path exists.
"""

from __future__ import annotations

import asyncio
import contextlib
import hmac
import json
import uuid
from collections.abc import AsyncIterator, Awaitable, Callable
from typing import TYPE_CHECKING, Protocol

from aiohttp import web

from engine.remote.messages import PROTOCOL, TokenizerPayload, WorkerInfo, to_json
from engine.serving.worker.events import KvEventHub
from engine.serving.worker.load import LoadTracker
from engine.serving.worker.state import WORKER, WorkerState
from engine.serving.worker.transport import add_transport

if TYPE_CHECKING:
    from engine.serving.async_engine import AsyncEngine

EVENT_INTERVAL_S = 0.05
Handler = Callable[[web.Request], Awaitable[web.StreamResponse]]


class Middleware(Protocol):
    """What ``web.Application(middlewares=...)`` takes: aiohttp calls it by parameter name, so a
    positional ``Callable`` does not fit (its own Protocol lives in the undocumented typedefs)."""

    def __call__(self, request: web.Request, handler: Handler) -> Awaitable[web.StreamResponse]: ...


def token_middleware(token: str) -> Middleware:
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
    app = web.Application(middlewares=[token_middleware(token)], client_max_size=1 << 16)
    stats = engine.cache_stats()
    info = WorkerInfo(
        worker_id=worker_id,
        boot_id=uuid.uuid4().hex,
        block_size=int(engine.config.block_size),
        max_model_len=int(engine.max_model_len),
        blocks_total=stats.blocks_total,
        pin_budget_blocks=int(stats.blocks_total * engine.config.pin_cap_fraction),
        protocol=PROTOCOL,
    )
    app[WORKER] = WorkerState(engine, info, events, LoadTracker(), token)
    app.cleanup_ctx.append(_lifecycle)
    app.router.add_get("/healthz", _healthz)
    app.router.add_get("/v1/info", _info)
    app.router.add_get("/v1/tokenizer", _tokenizer)
    add_transport(app)
    return app


async def _lifecycle(app: web.Application) -> AsyncIterator[None]:
    state = app[WORKER]
    await state.engine.start()
    pump = asyncio.get_running_loop().create_task(state.events.run(EVENT_INTERVAL_S))
    yield
    pump.cancel()
    with contextlib.suppress(asyncio.CancelledError):
        await pump
    await state.engine.shutdown()


def _json(body: bytes, status: int = 200) -> web.Response:
    return web.Response(body=body, status=status, content_type="application/json")


async def _healthz(request: web.Request) -> web.Response:
    ok = request.app[WORKER].engine.is_running
    return _json(json.dumps({"status": "ok" if ok else "down"}).encode(), 200 if ok else 503)


async def _info(request: web.Request) -> web.Response:
    return _json(to_json(request.app[WORKER].info))


async def _tokenizer(request: web.Request) -> web.Response:
    return _json(to_json(TokenizerPayload.of(request.app[WORKER].engine.tokenizer)))
