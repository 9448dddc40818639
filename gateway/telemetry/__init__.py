"""Logs (structlog JSON), traces (OpenTelemetry, app-owned provider), metrics (Prometheus, served
on a listener of their own)."""

from __future__ import annotations

from gateway.telemetry.listener import MetricsListener, metrics_listener
from gateway.telemetry.logs import configure_logging
from gateway.telemetry.metrics import GatewayMetrics
from gateway.telemetry.tracing import make_tracer, make_tracer_provider

__all__ = [
    "GatewayMetrics",
    "MetricsListener",
    "configure_logging",
    "make_tracer",
    "make_tracer_provider",
    "metrics_listener",
]
