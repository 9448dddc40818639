"""``GET /admin/v1/cluster`` and the per-worker Prometheus metrics.

Both read the engine at request / scrape time from the app's ``RunningEngine`` (it opens after
the app is built); tenants are named by id (the pin manager passes it), never by cache salt.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any, Protocol

from aiohttp import web
from prometheus_client import CollectorRegistry
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily
from prometheus_client.registry import Collector

from gateway.cluster.engine import ClusterEngine


class ClusterView(Protocol):
    """Where the view finds the cluster (gateway/lifecycle/engine_source.py ``RunningEngine``)."""

    @property
    def cluster(self) -> ClusterEngine | None: ...  # None: the engine runs in this process


CLUSTER = web.AppKey("cluster", ClusterView)


def add_cluster_view(
    admin: web.Application, view: ClusterView, registry: CollectorRegistry
) -> None:
    """Route ``/v1/cluster`` on the admin sub-app; per-worker metrics while the engine is a
    cluster (nothing for an in-process engine)."""
    admin[CLUSTER] = view
    admin.router.add_get("/v1/cluster", _cluster)
    registry.register(ClusterCollector(view))


async def _cluster(request: web.Request) -> web.Response:
    engine = request.app[CLUSTER].cluster
    if engine is None:
        return web.json_response({"mode": "in_process", "workers": [], "tenants": {}})
    return web.json_response(cluster_report(engine))


def cluster_report(engine: ClusterEngine) -> dict[str, Any]:
    live = engine.healthy()
    pins = list(engine.placer.pins.values())
    workers = []
    for m in sorted(engine.members.values(), key=lambda m: m.worker_id):
        wid = m.worker_id
        load, info = m.load, m.info
        workers.append(
            {
                "worker_id": wid,
                "url": m.url,  # the HTTP probes
                "calls": m.client.calls_endpoint,  # the transport: unix:PATH for the local one
                "healthy": m.healthy,
                "failed_checks": m.failures,
                "running": load.running if load else None,
                "waiting": load.waiting if load else None,
                "outstanding_tokens": m.cost,
                "queue_delay_s": round(m.queue_delay_s, 4),
                "blocks_total": load.stats.blocks_total if load else None,
                "blocks_free": load.stats.blocks_free if load else None,
                "blocks_pinned": load.stats.blocks_pinned if load else None,
                "pin_budget_blocks": info.pin_budget_blocks if info else None,
                "pinned_tenants": sorted(p.tenant_id for p in pins if wid in p.handles),
                "routed": dict(m.routed),
                # vLLM replicas: placed prompts warmed again after the server evicted blocks
                "rewarms": m.client.rewarms,
            }
        )
    placement = engine.placer.placement
    return {
        "mode": "cluster",
        "backend": engine.backend,
        "workers": workers,
        "tenants": {
            p.tenant_id: {
                "placed_on": list(placement.workers_of(p.key)),
                "pinned_on": p.workers(live),
                "pin_tiers": p.tiers(live),
                "blocks": p.blocks,
                "rejected": dict(p.rejected),
            }
            for p in sorted(pins, key=lambda p: p.tenant_id)
        },
        "retries": engine.retries,
        "failovers": engine.failovers,
        "pin_moves": engine.placer.moves,
        "rewarms": sum(m.client.rewarms for m in engine.members.values()),
        "last_reconcile_s": round(engine.placer.last_reconcile_s, 4),
    }


class ClusterCollector(Collector):
    def __init__(self, view: ClusterView) -> None:
        self._view = view

    def collect(self) -> Iterator[Any]:
        e = self._view.cluster
        if e is None:
            return
        up = GaugeMetricFamily(
            "kvgate_worker_up", "1 while the worker is healthy", labels=["worker"]
        )
        reqs = GaugeMetricFamily(
            "kvgate_worker_requests", "requests on the worker", labels=["worker", "state"]
        )
        blocks = GaugeMetricFamily(
            "kvgate_worker_kv_blocks", "KV blocks of the worker", labels=["worker", "state"]
        )
        tenants = GaugeMetricFamily(
            "kvgate_worker_pinned_tenants", "tenants pinned on the worker", labels=["worker"]
        )
        delay = GaugeMetricFamily(
            "kvgate_worker_queue_delay_seconds", "queue delay (EWMA)", labels=["worker"]
        )
        routed = CounterMetricFamily(
            "kvgate_worker_routed_requests",
            "requests routed, by reason",
            labels=["worker", "reason"],
        )
        pins = list(e.placer.pins.values())
        for m in e.members.values():
            w = m.worker_id
            up.add_metric([w], 1.0 if m.healthy else 0.0)
            delay.add_metric([w], m.queue_delay_s)
            tenants.add_metric([w], float(sum(1 for p in pins if w in p.handles)))
            if m.load is not None:
                reqs.add_metric([w, "running"], float(m.load.running))
                reqs.add_metric([w, "waiting"], float(m.load.waiting))
                for state in ("total", "free", "pinned"):
                    blocks.add_metric([w, state], float(getattr(m.load.stats, f"blocks_{state}")))
            for reason, n in m.routed.items():
                routed.add_metric([w, reason], float(n))
        rewarms = CounterMetricFamily(
            "kvgate_worker_rewarms",
            "placed prompts warmed again after a vLLM server evicted their blocks",
            labels=["worker"],
        )
        for m in e.members.values():
            rewarms.add_metric([m.worker_id], float(m.client.rewarms))
        yield from (up, reqs, blocks, tenants, delay, routed, rewarms)
        yield CounterMetricFamily(
            "kvgate_cluster_retries", "requests retried on another worker", value=e.retries
        )
        yield CounterMetricFamily(
            "kvgate_cluster_failovers", "workers taken out after failing", value=e.failovers
        )
        yield GaugeMetricFamily(
            "kvgate_cluster_reconcile_seconds",
            "duration of the latest placement reconcile",
            value=e.placer.last_reconcile_s,
        )
