"""``create_app(settings)``: the gateway application (chat API, admin sub-app, health, metrics).

Nothing happens at import. ``create_app`` only builds objects: it reads no model, starts no
process and connects nowhere (the tenant store's connection pool connects lazily; the engine is
only chosen, gateway/lifecycle/engine_source.py). Everything that loads, starts or connects lives in
``cleanup_ctx``, in this order (closed in reverse)::

    telemetry provider -> tenant store (schema check, secrets key check)
    -> usage ledger (spool, replay) + events
    -> limiter
    -> engine: opened (model loaded on a thread / local worker started / workers' info fetched),
       then started -> key cache + pins (start-up pinning in the background; /readyz waits)

A failed step fails start-up (``AppRunner.setup`` raises) after closing what was opened before
it, in reverse: an engine that cannot open leaves no worker process behind.
"""

from __future__ import annotations

import contextlib
from collections.abc import AsyncIterator, Callable

from aiohttp import web
from opentelemetry.sdk.trace.export import SpanExporter
from sqlalchemy.ext.asyncio import AsyncEngine

from engine.api import EngineClient
from engine.errors import (
    DuplicateRequestId,
    EngineClosed,
    EngineDead,
    EngineOverloaded,
    GrammarRejected,
    PromptTooLong,
    RequestAborted,
    RequestRejected,
    TenantQueueFull,
)
from gateway.access.auth import KeyCache
from gateway.admin import (
    ADMIN_PREFIX,
    ADMIN_SESSIONS,
    MemorySessionStore,
    PromptLimit,
    RedisSessionStore,
    SessionStore,
    create_admin_app,
)
from gateway.admin.context import ADMIN_CONTEXT
from gateway.admin.throttle import AdminThrottle, ThrottleLimits
from gateway.chat import views
from gateway.chat.tools.run.budget_webhook import SoftWebhooks
from gateway.chat.tools.run.runner import TOOL_RUNNER
from gateway.chat.tools.run.setup import make_tool_runner
from gateway.chat.tools.tenant import VersionPrefixes
from gateway.cluster.admin import add_cluster_view
from gateway.cluster.engine import ClusterEngine
from gateway.context import SETTINGS, STATE, TELEMETRY, GatewayState, Telemetry
from gateway.errors import error_middleware, register_error
from gateway.home import register_home
from gateway.http import content_encoding_middleware
from gateway.lifecycle.dbready import DB_PROBE, DatabaseProbe
from gateway.lifecycle.engine_source import EngineSource, RunningEngine, choose_source
from gateway.lifecycle.heap import frozen_startup_heap
from gateway.openapi.document import openapi_handler
from gateway.prompts.pins import PinManager
from gateway.prompts.tenant_prefix import TemplateMismatch
from gateway.prompts.tokenize_pool import TokenizePool
from gateway.ratelimit import FailoverLimiter, Limiter, MemoryLimiter, RedisLimiter
from gateway.ratelimit.redis import make_client
from gateway.ratelimit.types import LimiterUnavailable
from gateway.settings import Settings
from gateway.telemetry import GatewayMetrics, make_tracer, make_tracer_provider
from gateway.telemetry.dbgauge import database_gauge
from gateway.usage.admin import AUDIT_ACTOR, add_usage_routes
from gateway.usage.budget_admin import add_budget_routes
from gateway.usage.ledger import LEDGER, Ledger
from gateway.widget.cors import add_preflight, cors_headers
from gateway.widget.routes import register_widget
from tenants.db import make_engine, make_session_factory, within
from tenants.events import RedisEventBridge
from tenants.health import DbHealth
from tenants.keys import LastUsedRecorder
from tenants.migrate import check_schema
from tenants.runtime import ToolPolicy
from tenants.store import TenantStore
from tenants.tool_service import ToolStore


def register_gateway_errors() -> None:
    """Engine and limiter errors as HTTP (idempotent)."""
    register_error(PromptTooLong, 400, "invalid_request_error", "context_length_exceeded")
    register_error(DuplicateRequestId, 400, "invalid_request_error", "duplicate_request_id")
    register_error(GrammarRejected, 400, "invalid_request_error", "unsupported_schema")
    register_error(RequestRejected, 400, "invalid_request_error", "engine_rejected")
    retry = {"Retry-After": "1"}
    register_error(EngineOverloaded, 503, "service_unavailable", "engine_overloaded", retry)
    # this tenant's share of the engine queue is full (the others are served): a rate limit
    register_error(TenantQueueFull, 429, "rate_limit_error", "tenant_queue_full", retry)
    register_error(EngineClosed, 503, "service_unavailable", "engine_unavailable")
    register_error(EngineDead, 503, "service_unavailable", "engine_unavailable")
    register_error(RequestAborted, 503, "service_unavailable", "request_aborted")
    register_error(LimiterUnavailable, 503, "service_unavailable", "rate_limiter_unavailable")
    register_error(TemplateMismatch, 500, "internal_error", "chat_template_mismatch")


def create_app(
    settings: Settings,
    *,
    engine: EngineClient | None = None,
    cluster: ClusterEngine | None = None,
    model_dir: str | None = None,
    span_exporter: SpanExporter | None = None,
    local_worker: bool = False,
) -> web.Application:
    """The gateway. ``engine``: an engine in this process (not started) to use instead of
    loading ``model_dir`` / ``KVGATE_MODEL``; ``cluster``: an engine in worker processes (not
    started) to use instead; ``span_exporter``: an extra exporter (tests).
    With ``KVGATE_WORKERS`` set, or ``local_worker`` (``kvgate serve``: one worker process,
    started when the app starts), the engine runs in worker processes (gateway/cluster/).
    Configuration errors (no model, workers without a token) raise here; nothing is opened."""
    register_gateway_errors()
    source = choose_source(
        settings, engine=engine, cluster=cluster, model_dir=model_dir, local_worker=local_worker
    )
    opened = RunningEngine()
    model_name = settings.model.name or _model_name(model_dir or settings.model.path)
    app = web.Application(
        middlewares=[error_middleware, content_encoding_middleware],
        client_max_size=settings.server.max_body_bytes,
    )
    app[SETTINGS] = settings
    provider = make_tracer_provider(settings.telemetry, span_exporter)
    exporting = span_exporter is not None or settings.telemetry.otlp_endpoint is not None
    tracer = make_tracer(provider, exporting)
    app[TELEMETRY] = Telemetry(GatewayMetrics(), provider, tracer)
    dbs = settings.database  # every request-path database call is bounded (docs/operations.md)
    db = make_engine(settings.tenants.database_url, timeout_s=dbs.timeout_s)  # connects lazily
    store = TenantStore(
        make_session_factory(db),
        default_limits=settings.tenants.default_limits,
        engine=db,
        deadline_s=dbs.timeout_s,
        health=DbHealth(dbs.retry_s),
        secrets=settings.tenants.secrets,
    )
    auth = settings.auth
    app[ADMIN_SESSIONS] = make_sessions(settings)  # Redis: shared by every replica
    admin = create_admin_app(
        store,
        admin_token_sha256=settings.tenants.admin_token_sha256,
        prompt_limit=_prompt_limit(app, opened),
        cache_provider=lambda tenant_id: app[STATE].pins.cache_info(tenant_id),
        sessions=app[ADMIN_SESSIONS],
        principal_ttl_s=auth.key_cache_ttl_s,
        throttle=_admin_throttle(app, settings),
    )
    add_cluster_view(admin, opened, app[TELEMETRY].metrics.registry)
    if settings.usage.enabled:  # built here, opened with the app (no file or connection yet)
        rl = settings.ratelimit
        app[LEDGER] = admin[LEDGER] = Ledger(
            settings.usage,
            settings.tenants.database_url,
            redis_url=rl.redis_url,
            redis_prefix=rl.redis_prefix,
            redis_timeout_s=rl.redis_timeout_s,
            registry=app[TELEMETRY].metrics.registry,
        )
        admin[AUDIT_ACTOR] = lambda: admin[ADMIN_CONTEXT].actor
        add_usage_routes(admin)
        add_budget_routes(admin)
    app.add_subapp(ADMIN_PREFIX, admin)
    app.cleanup_ctx.append(_lifecycle(store, db, source, opened, model_name))
    app.cleanup_ctx.append(_close_sessions)
    app.cleanup_ctx.append(frozen_startup_heap)  # last: after everything start-up keeps
    app.on_shutdown.append(_start_draining)
    app.on_response_prepare.append(cors_headers)
    app.router.add_post("/v1/chat/completions", views.chat_completions)
    app.router.add_get("/v1/models", views.list_models)
    add_preflight(app, "/v1/chat/completions", "/v1/models")
    register_widget(app, settings)
    register_home(app, settings)
    app.router.add_get("/healthz", _healthz)
    openapi = openapi_handler(model_name, widget_demo=settings.widget.demo)
    app.router.add_get("/openapi.json", openapi)
    app.router.add_get("/readyz", _readyz)
    app[DB_PROBE] = DatabaseProbe()
    return app


def _prompt_limit(app: web.Application, opened: RunningEngine) -> PromptLimit:
    """A version's tokens as the tenant prefix renders them (text and tools; the encoding kept
    for the pin manager's build of the same version), at most half the context."""

    def count(text: str, tools: ToolPolicy) -> int:
        return len(app[STATE].encode_version(text, tools))

    return PromptLimit(count, max_tokens=lambda: max(1, opened.engine.info.max_model_len // 2))


def _admin_throttle(app: web.Application, settings: Settings) -> AdminThrottle:
    """Admin writes and failed sign-ins counted by the gateway's limiter once it runs."""
    auth = settings.auth
    rl = settings.ratelimit
    limits = ThrottleLimits(
        auth.writes_per_minute,
        auth.sign_in_failures_per_minute,
        rl.trusted_proxies,
        rl.visitor_ipv6_prefix,
    )
    return AdminThrottle(limits, limiter=lambda: app[STATE].limiter if STATE in app else None)


def _model_name(path: str | None) -> str:
    from pathlib import Path

    return Path(path).resolve().name if path else "kvgate-demo"


def make_sessions(settings: Settings) -> SessionStore:
    """The console's sessions: in the gateway's Redis when it has one (same client settings and
    key prefix as the rate limiter), else in this process."""
    auth, rl = settings.auth, settings.ratelimit
    if rl.redis_url is None:
        return MemorySessionStore(auth.session_idle_s, auth.session_max_s)
    client = make_client(rl.redis_url, rl.redis_timeout_s)  # connects at its first command
    return RedisSessionStore(client, rl.redis_prefix, auth.session_idle_s, auth.session_max_s)


async def _close_sessions(app: web.Application) -> AsyncIterator[None]:
    yield
    await app[ADMIN_SESSIONS].aclose()


def make_limiter(settings: Settings) -> Limiter:
    rl = settings.ratelimit
    if rl.redis_url is None:
        return MemoryLimiter(rl.lease_ttl_s)
    return FailoverLimiter(
        RedisLimiter.connect(rl.redis_url, rl.redis_timeout_s, rl.redis_prefix, rl.lease_ttl_s),
        MemoryLimiter(rl.lease_ttl_s),
        fail_open=rl.fail_open,
        retry_s=rl.redis_retry_s,
        share=rl.failover_share,
    )


def _lifecycle(
    store: TenantStore,
    db: AsyncEngine,
    source: EngineSource,
    opened: RunningEngine,
    model_name: str,
) -> Callable[[web.Application], AsyncIterator[None]]:
    async def ctx(app: web.Application) -> AsyncIterator[None]:
        settings = app[SETTINGS]
        tel = app[TELEMETRY]
        async with contextlib.AsyncExitStack() as stack:
            stack.push_async_callback(_shutdown_provider, tel)
            stack.push_async_callback(store.aclose)
            await check_schema(db)
            # the secrets key: loaded and checked against the database (a wrong one fails here)
            await store.secrets.box()
            if LEDGER in app:  # after the schema check; closed after the requests drained
                await app[LEDGER].start()
                stack.push_async_callback(app[LEDGER].close)
            bridge = None
            if settings.tenants.redis_url:
                bridge = RedisEventBridge.from_url(
                    store.bus, settings.tenants.redis_url, settings.tenants.event_channel
                )
                await bridge.start()
                stack.push_async_callback(bridge.aclose)
            limiter = make_limiter(settings)
            stack.push_async_callback(limiter.close)
            await limiter.warm()
            opening = await source.open()
            engine = opening.engine
            stack.push_async_callback(engine.shutdown)  # also when start fails: stops a worker
            opened.set(opening)
            await engine.start()
            recorder = LastUsedRecorder()
            recorder.start(store.sessions, settings.tenants.last_used_flush_s)
            stack.push_async_callback(_flush_recorder, recorder, store)
            keys = KeyCache(
                store,
                settings.auth.key_cache_ttl_s,
                on_use=recorder.record,
                stale_max_s=settings.database.stale_max_s,
            )
            tokenizer = engine.info.tokenizer
            prompts = TokenizePool()  # prompts and prefixes off the loop (pins' builds too)
            prefixes = VersionPrefixes(tokenizer, tokenizer.chat_template)
            pins = PinManager(engine, tokenizer, store, prefixes.of_runtime, prompts.run)
            stack.push_async_callback(pins.close)
            state = GatewayState(
                store,
                limiter,
                engine,
                tokenizer,
                model_name,
                keys,
                pins,
                prefixes.encode,
                prompts=prompts,
            )
            runner = make_tool_runner(settings.tools, store, tel.tracer, tel.metrics.registry)
            stack.push_async_callback(runner.egress.close)
            app[TOOL_RUNNER] = runner
            ledger = app.get(LEDGER)
            if ledger is not None and ledger.budgets is not None:
                hooks = SoftWebhooks(runner.egress, ToolStore(store).secret, tel.metrics.registry)
                ledger.budgets.on_soft = hooks
                stack.push_async_callback(hooks.close)
            stack.callback(state.prompts.close)
            await state.prompts.warm(tokenizer.prepare_chat_encoding)
            app[STATE] = state
            store.bus.subscribe(keys.on_event)
            store.bus.subscribe(pins.on_event)
            tel.metrics.watch(
                engine.cache_stats, limiter, lambda: database_gauge(store.health, keys.stale_max_s)
            )
            pins.spawn(pins.pin_all())
            yield

    return ctx


async def _flush_recorder(recorder: LastUsedRecorder, store: TenantStore) -> None:
    with contextlib.suppress(Exception):  # best effort: timestamps only, bounded
        await within(store.deadline_s, recorder.aclose(store.sessions))


async def _shutdown_provider(tel: Telemetry) -> None:
    tel.provider.shutdown()


async def _start_draining(app: web.Application) -> None:
    """on_shutdown (listening has stopped): refuse new requests, let chat requests finish
    until the shutdown deadline, end the rest with a shutdown error (gateway/lifecycle/drain.py)."""
    if STATE in app:
        app[STATE].draining = True
        await app[STATE].drain.run(app[SETTINGS].server.shutdown_timeout_s)


async def _healthz(request: web.Request) -> web.Response:
    return web.json_response({"status": "ok"})


async def _readyz(request: web.Request) -> web.Response:
    state = request.app[STATE]
    checks: dict[str, bool] = {"accepting": not state.draining}  # false once shutdown began
    # Within about 1 s; answered from the last probe for a second (gateway/lifecycle/dbready.py).
    database = await request.app[DB_PROBE].readiness(state.store, state.keys)
    checks["database"] = database.passing  # passes while degraded (last-known-good)
    redis = "none"  # no Redis configured: the in-process limiter
    shared = state.limiter.shared_state()
    if shared is not None:
        up = await state.limiter.ping()
        # Fail open: the in-process limiter serves while Redis is away (degraded, still ready).
        redis = "up" if up else "degraded" if shared.fail_open else "down"
        checks["redis"] = redis != "down"
    checks["engine"] = bool(state.engine.is_running)
    checks["pins"] = state.pins.ready.is_set()
    ok = all(checks.values())
    body = {"ready": ok, "checks": checks, "database": database.report(), "redis": redis}
    return web.json_response(body, status=200 if ok else 503)
