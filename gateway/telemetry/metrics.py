"""Prometheus metrics in a registry owned by one app (never the process-global registry).

Counters and histograms are updated by the chat view; gauges of the engine's KV pool, the
limiter state and the tenant database's health are read at scrape time by a collector, so they
are never stale.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from typing import Any

from prometheus_client import CollectorRegistry, Counter, Histogram, generate_latest
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily
from prometheus_client.registry import Collector

from gateway.ratelimit.types import Limiter
from gateway.telemetry.dbgauge import DatabaseGauge

CONTENT_TYPE = "text/plain; version=0.0.4; charset=utf-8"
_TTFT_BUCKETS = (0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0)
_TPOT_BUCKETS = (0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0)


class _StateCollector(Collector):
    """Scrape-time gauges from ``cache_stats()`` and the limiter's fail-over counters."""

    def __init__(
        self,
        cache_stats: Callable[[], Any] | None,
        limiter: Limiter | None,
        database: Callable[[], DatabaseGauge] | None = None,
    ) -> None:
        self._cache_stats = cache_stats
        self._limiter = limiter
        self._database = database

    def collect(self) -> Iterator[Any]:
        if self._database is not None:
            yield from _database_gauges(self._database())
        if self._cache_stats is not None:
            stats = self._cache_stats()
            blocks = GaugeMetricFamily("kvgate_kv_blocks", "KV cache blocks", labels=["state"])
            for state in ("total", "free", "pinned"):
                value = _stat(stats, f"blocks_{state}")
                if value is not None:
                    blocks.add_metric([state], float(value))
            for state in ("total", "cached", "pinned"):  # the host-memory tier
                value = _stat(stats, f"host_blocks_{state}")
                if value is not None:
                    blocks.add_metric([f"host_{state}"], float(value))
            yield blocks
            yield from _tier_counters(stats)
        shared = self._limiter.shared_state() if self._limiter is not None else None
        if shared is not None:
            yield GaugeMetricFamily(
                "kvgate_ratelimit_redis_down",
                "1 while the shared limiter is unreachable",
                value=float(shared.down),
            )
            yield CounterMetricFamily(
                "kvgate_ratelimit_failovers",
                "Redis limiter UP -> DOWN transitions",
                value=float(shared.failovers),
            )
            yield CounterMetricFamily(
                "kvgate_ratelimit_fallback_decisions",
                "admissions decided in-process while Redis was down",
                value=float(shared.fallback_decisions),
            )


def _database_gauges(db: DatabaseGauge) -> Iterator[Any]:
    yield GaugeMetricFamily(
        "kvgate_database_up", "1 while the tenant database answers", value=float(db.up)
    )
    yield GaugeMetricFamily(
        "kvgate_database_serving_stale",
        "1 while the database is out and known keys are served from last-known-good",
        value=float(db.serving_stale),
    )


# Host tier and snapshot counters of ``CacheStats``: (series, help, stats field).
_TIER_COUNTERS = (
    ("kvgate_kv_host_hit_tokens", "prompt tokens served from the host tier", "host_hit_tokens"),
    ("kvgate_kv_blocks_offloaded", "KV blocks copied device -> host", "blocks_offloaded"),
    ("kvgate_kv_blocks_restored", "KV blocks copied host -> device", "blocks_restored"),
    ("kvgate_kv_bytes_offloaded", "KV bytes copied device -> host", "bytes_offloaded"),
    ("kvgate_kv_bytes_restored", "KV bytes copied host -> device", "bytes_restored"),
    ("kvgate_kv_transfer_seconds", "time spent in tier copies", "transfer_us"),
    ("kvgate_kv_snapshot_restores", "pinned prompts restored from disk", "snapshot_restores"),
    ("kvgate_kv_snapshot_restore_seconds", "time restoring from disk", "snapshot_restore_us"),
)


def _tier_counters(stats: Any) -> Iterator[Any]:
    for name, help_text, field in _TIER_COUNTERS:
        value = _stat(stats, field)
        if value is None:
            continue
        if field.endswith("_us"):
            value /= 1e6
        yield CounterMetricFamily(name, help_text, value=value)


def _stat(stats: Any, *names: str) -> float | None:
    for name in names:
        value = stats.get(name) if isinstance(stats, dict) else getattr(stats, name, None)
        if value is not None:
            return float(value)
    return None


class TenantSeries:
    """One tenant's children of the per-tenant series, looked up once per tenant (``labels()``
    checks, converts and locks on every call; a request would make six such calls)."""

    def __init__(self, metrics: GatewayMetrics, tenant_id: str) -> None:
        self.prefix_hit_tokens = metrics.prefix_hit_tokens.labels(tenant_id)
        self.prefix_query_tokens = metrics.prefix_query_tokens.labels(tenant_id)
        self.output_tokens = metrics.output_tokens.labels(tenant_id)
        self.ttft = metrics.ttft.labels(tenant_id)
        self.tpot = metrics.tpot.labels(tenant_id)
        self._requests = metrics.requests
        self._tenant_id = tenant_id
        self._by_status: dict[int, Any] = {}

    def count_request(self, status: int) -> None:
        child = self._by_status.get(status)
        if child is None:
            child = self._requests.labels(self._tenant_id, str(status))
            self._by_status[status] = child
        child.inc()


class GatewayMetrics:
    def __init__(self) -> None:
        self.registry = CollectorRegistry(auto_describe=True)
        r = self.registry
        self.requests = Counter(
            "kvgate_requests",
            "chat requests by tenant and HTTP status",
            ["tenant", "status"],
            registry=r,
        )
        self.ttft = Histogram(
            "kvgate_ttft_seconds",
            "time to first token",
            ["tenant"],
            buckets=_TTFT_BUCKETS,
            registry=r,
        )
        self.tpot = Histogram(
            "kvgate_time_per_output_token_seconds",
            "decode time per output token after the first",
            ["tenant"],
            buckets=_TPOT_BUCKETS,
            registry=r,
        )
        self.prefix_hit_tokens = Counter(
            "kvgate_prefix_cache_hit_tokens",
            "prompt tokens served from the prefix cache",
            ["tenant"],
            registry=r,
        )
        self.prefix_query_tokens = Counter(
            "kvgate_prefix_cache_query_tokens",
            "prompt tokens looked up in the prefix cache",
            ["tenant"],
            registry=r,
        )
        self.output_tokens = Counter(
            "kvgate_output_tokens", "generated tokens", ["tenant"], registry=r
        )
        self.ratelimit_rejections = Counter(
            "kvgate_ratelimit_rejections",
            "429 answers by tenant, exhausted limit and refusing scope (tenant, key, visitor)",
            ["tenant", "reason", "scope"],
            registry=r,
        )
        self._state: _StateCollector | None = None
        self._tenants: dict[str, TenantSeries] = {}

    def tenant(self, tenant_id: str) -> TenantSeries:
        series = self._tenants.get(tenant_id)
        if series is None:
            series = self._tenants[tenant_id] = TenantSeries(self, tenant_id)
        return series

    def watch(
        self,
        cache_stats: Callable[[], Any] | None,
        limiter: Limiter | None,
        database: Callable[[], DatabaseGauge] | None = None,
    ) -> None:
        """Register the scrape-time collector (once the engine, limiter and key cache exist)."""
        if self._state is not None:
            self.registry.unregister(self._state)
        self._state = _StateCollector(cache_stats, limiter, database)
        self.registry.register(self._state)

    def render(self) -> bytes:
        return generate_latest(self.registry)
