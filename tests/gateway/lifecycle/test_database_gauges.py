"""kvgate_database_up / kvgate_database_serving_stale: the /readyz rule, read at scrape time."""

from __future__ import annotations

import re

from gateway.telemetry import GatewayMetrics
from gateway.telemetry.dbgauge import DatabaseGauge, database_gauge
from tenants.errors import StoreUnavailable
from tenants.health import DbHealth

STALE_MAX_S = 60.0


class Clock:
    def __init__(self) -> None:
        self.now = 100.0

    def __call__(self) -> float:
        return self.now


def gauges(metrics: GatewayMetrics) -> tuple[float, float]:
    text = metrics.render().decode()
    up = re.search(r"^kvgate_database_up (\S+)$", text, re.M)
    stale = re.search(r"^kvgate_database_serving_stale (\S+)$", text, re.M)
    assert up is not None and stale is not None, text
    return float(up.group(1)), float(stale.group(1))


def test_gauges_follow_the_database_health_through_an_outage() -> None:
    clock = Clock()
    health = DbHealth(retry_s=1.0, clock=clock)
    metrics = GatewayMetrics()
    metrics.watch(None, None, lambda: database_gauge(health, STALE_MAX_S))
    assert gauges(metrics) == (1.0, 0.0)
    health.failed(StoreUnavailable("refused"))
    clock.now += 10
    assert gauges(metrics) == (0.0, 1.0)  # known keys answered from last-known-good
    clock.now += STALE_MAX_S
    assert gauges(metrics) == (0.0, 0.0)  # past the stale limit: nothing is served
    health.succeeded()
    assert gauges(metrics) == (1.0, 0.0)
    health.check_integrity()


def test_without_a_database_source_no_database_series_are_exported() -> None:
    metrics = GatewayMetrics()
    metrics.watch(None, None)
    assert b"kvgate_database_up" not in metrics.render()
    assert database_gauge(DbHealth(), 0.0) == DatabaseGauge(True, False)
