"""The app's own TracerProvider (never the global one).

OTLP/HTTP export when ``OTEL_EXPORTER_OTLP_ENDPOINT`` is set; tests pass an in-memory exporter.
Span layout of one chat request (GenAI semantic conventions)::

    chat {model}                      SpanKind.SERVER, gen_ai.* request/usage attributes
      ├─ gen_ai.rate_limit           one limiter round trip
      ├─ gen_ai.queue                 submitted -> first scheduled step (engine timings)
      ├─ gen_ai.prefill               first scheduled step -> first token
      └─ gen_ai.decode                first token -> last token
"""

from __future__ import annotations

from opentelemetry import trace
from opentelemetry.sdk.resources import Resource
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import (
    BatchSpanProcessor,
    SimpleSpanProcessor,
    SpanExporter,
)

from gateway.settings import TelemetrySettings


def make_tracer(provider: TracerProvider, exporting: bool) -> trace.Tracer:
    """The app's tracer; a no-op tracer when nothing exports spans (they would be dropped
    anyway, and building five spans per request is not free)."""
    return provider.get_tracer("kvgate.gateway") if exporting else trace.NoOpTracer()


def make_tracer_provider(
    settings: TelemetrySettings, exporter: SpanExporter | None = None
) -> TracerProvider:
    provider = TracerProvider(resource=Resource.create({"service.name": settings.service_name}))
    if exporter is not None:
        provider.add_span_processor(SimpleSpanProcessor(exporter))
    if settings.otlp_endpoint:
        from opentelemetry.exporter.otlp.proto.http.trace_exporter import OTLPSpanExporter

        # OTLP/HTTP: the base endpoint + /v1/traces (other OTEL_EXPORTER_OTLP_* are read by
        # the exporter itself, e.g. headers).
        endpoint = settings.otlp_endpoint.rstrip("/") + "/v1/traces"
        provider.add_span_processor(BatchSpanProcessor(OTLPSpanExporter(endpoint=endpoint)))
    return provider
