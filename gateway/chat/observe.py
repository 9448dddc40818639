"""Per-request telemetry: the OTel span tree, Prometheus updates and the one log line.

GenAI semantic conventions on the ``chat {model}`` span: gen_ai.operation.name,
gen_ai.provider.name, gen_ai.request.model / max_tokens / temperature / top_p / seed,
gen_ai.response.id / model / finish_reasons, gen_ai.usage.input_tokens (cached included),
gen_ai.usage.output_tokens, gen_ai.usage.cache_read.input_tokens.
Queue, prefill and decode child spans are placed from the engine's own timestamps.

When nothing exports spans the app's tracer is a ``NoOpTracer``: its spans are the invalid span
whatever the parent, so the observer skips span work entirely (no context attach, no attributes).
Likewise the log line's fields are only built when its level is enabled.
"""

from __future__ import annotations

import contextlib
import logging
import time
from collections.abc import Iterator, Mapping
from typing import Any

import structlog
from opentelemetry import trace
from opentelemetry.trace import SpanKind, Status, StatusCode
from opentelemetry.trace.propagation.tracecontext import TraceContextTextMapPropagator

from gateway.chat.generation import GenerationStats
from gateway.chat.schemas import ChatRequest
from gateway.context import Telemetry

log = structlog.get_logger("gateway.chat")

PROVIDER_NAME = "kvgate"
_PROPAGATOR = TraceContextTextMapPropagator()  # W3C traceparent of the caller


def _epoch_ns(monotonic_s: float) -> int:
    """A ``time.monotonic()`` reading as epoch nanoseconds (what span timestamps use)."""
    return time.time_ns() - int((time.monotonic() - monotonic_s) * 1e9)


class RequestObserver:
    def __init__(
        self,
        telemetry: Telemetry,
        request_id: str,
        tenant_id: str,
        started: float,
        *,
        key_id: str | None = None,
        end_user_id: str | None = None,
    ) -> None:
        self._tel = telemetry
        self.key_id = key_id  # the key's id (its public handle), never the key
        self.end_user_id = end_user_id  # when the request names one
        self.request_id = request_id
        self.tenant_id = tenant_id
        self.started = started
        self.span: trace.Span = trace.INVALID_SPAN
        self.status = 500
        self.stream = False
        self.delivered = False  # a stream's last event was written
        self.stream_error: str | None = None  # a failure reported inside a started stream
        # A stream ended by the shutdown deadline (error event + [DONE]): recorded as 503
        # ``server_shutdown``, not as the 200 its headers said nor as a disconnect (499).
        self.cut_by_shutdown = False
        # The request's generation counters (set when the engine request is created), so the
        # outcome carries the real tokens however the handler ends.
        self.stats: GenerationStats | None = None
        self.tracing = not isinstance(telemetry.tracer, trace.NoOpTracer)

    @contextlib.contextmanager
    def request_span(self, body: ChatRequest, headers: Mapping[str, str]) -> Iterator[None]:
        """The server span, a child of the caller's trace when it sent ``traceparent``."""
        self.stream = body.stream
        if not self.tracing:
            yield
            return
        attrs: dict[str, Any] = {
            "gen_ai.operation.name": "chat",
            "gen_ai.provider.name": PROVIDER_NAME,
            "gen_ai.request.model": body.model,
            "gen_ai.response.model": body.model,
            "gen_ai.response.id": self.request_id,
            "kvgate.tenant.id": self.tenant_id,
            "kvgate.stream": body.stream,
        }
        for key, val in (
            ("gen_ai.request.temperature", body.temperature),
            ("gen_ai.request.top_p", body.top_p),
            ("gen_ai.request.seed", body.seed),
        ):
            if val is not None:
                attrs[key] = val
        tracer = self._tel.tracer
        with tracer.start_as_current_span(
            f"chat {body.model}",
            context=_PROPAGATOR.extract(headers),
            kind=SpanKind.SERVER,
            attributes=attrs,
            start_time=_epoch_ns(self.started),
            record_exception=False,
            set_status_on_exception=False,
        ) as span:
            self.span = span
            yield

    @contextlib.contextmanager
    def child(self, name: str) -> Iterator[None]:
        if not self.tracing:
            yield
            return
        with self._tel.tracer.start_as_current_span(name):
            yield

    def rejected(self, reason: str, scope: str) -> None:
        """A 429: ``reason`` the exhausted limit, ``scope`` the kind that refused it."""
        self._tel.metrics.ratelimit_rejections.labels(self.tenant_id, reason, scope).inc()

    def set_max_tokens(self, max_tokens: int) -> None:
        if self.tracing:
            self.span.set_attribute("gen_ai.request.max_tokens", max_tokens)

    def finish(self, status: int, stats: GenerationStats | None, error: str | None = None) -> None:
        """Close out the request: span attributes and timing children, metrics, one log line."""
        if self.cut_by_shutdown:
            status, error = 503, "server_shutdown"
        self.status, self.stats = status, stats
        m = self._tel.metrics.tenant(self.tenant_id)
        m.count_request(status)
        ttft = None
        if stats is not None:
            m.prefix_hit_tokens.inc(stats.cached_tokens)
            m.prefix_query_tokens.inc(stats.prompt_tokens)
            m.output_tokens.inc(stats.completion_tokens)
            if stats.first_token_at is not None:
                ttft = stats.first_token_at - self.started
                m.ttft.observe(ttft)
            if stats.last_token_at and stats.first_token_at and stats.completion_tokens > 1:
                tpot = (stats.last_token_at - stats.first_token_at) / (stats.completion_tokens - 1)
                m.tpot.observe(tpot)
        if self.tracing:
            self._span_outcome(status, stats, error)
        self._log(status, stats, ttft, error)

    def _span_outcome(self, status: int, stats: GenerationStats | None, error: str | None) -> None:
        if stats is not None:
            self._usage_attributes(stats)
            self._engine_spans(stats)
        if status >= 500:
            self.span.set_status(Status(StatusCode.ERROR, error or str(status)))
        self.span.set_attribute("http.response.status_code", status)
        if error:
            self.span.set_attribute("error.type", error)

    def _usage_attributes(self, stats: GenerationStats) -> None:
        s = self.span
        s.set_attribute("gen_ai.usage.input_tokens", stats.prompt_tokens)
        s.set_attribute("gen_ai.usage.output_tokens", stats.completion_tokens)
        s.set_attribute("gen_ai.usage.cache_read.input_tokens", stats.cached_tokens)
        if stats.finish_reason is not None:
            s.set_attribute("gen_ai.response.finish_reasons", [stats.finish_reason])

    def _engine_spans(self, stats: GenerationStats) -> None:
        em = stats.engine_metrics
        if em is None:
            return
        end = stats.last_token_at or time.monotonic()
        marks = [
            ("gen_ai.queue", em.arrival_time, em.first_scheduled_time),
            ("gen_ai.prefill", em.first_scheduled_time, em.first_token_time),
            ("gen_ai.decode", em.first_token_time, em.finish_time or end),
        ]
        tracer = self._tel.tracer
        parent = trace.set_span_in_context(self.span)
        for name, start, stop in marks:
            if start is None or stop is None:
                continue
            child = tracer.start_span(name, context=parent, start_time=_epoch_ns(start))
            child.end(end_time=_epoch_ns(max(start, stop)))

    def _log(
        self, status: int, stats: GenerationStats | None, ttft: float | None, error: str | None
    ) -> None:
        level = logging.WARNING if status >= 500 else logging.INFO
        if not _log_enabled(level):
            return
        ctx = self.span.get_span_context()
        fields: dict[str, Any] = {
            "request_id": self.request_id,
            "tenant": self.tenant_id,
            "key_id": self.key_id,
            "trace_id": format(ctx.trace_id, "032x") if ctx.is_valid else None,
            "status": status,
            "stream": self.stream,
            "duration_ms": round((time.monotonic() - self.started) * 1000, 2),
        }
        if stats is not None:
            fields.update(
                prompt_tokens=stats.prompt_tokens,
                completion_tokens=stats.completion_tokens,
                cached_tokens=stats.cached_tokens,
                finish_reason=stats.finish_reason,
                ttft_ms=round(ttft * 1000, 2) if ttft is not None else None,
            )
        if error:
            fields["error"] = error
        if self.end_user_id is not None:
            fields["end_user"] = self.end_user_id
        (log.warning if status >= 500 else log.info)("chat_request", **fields)


def _log_enabled(level: int) -> bool:
    """False when the configured structlog logger drops ``level`` anyway (loggers without a
    level check are asked to log)."""
    check = getattr(log, "is_enabled_for", None)
    return check is None or bool(check(level))
