"""Tenants that lose the competition for scarce pin room: a still placement, and routing to
where their prompt is still cached."""

from __future__ import annotations

from engine.core.kv.hashing import block_keys, root_key
from engine.remote.client import WorkerClient, WorkerInfo
from engine.remote.messages import STORED, kv_events
from gateway.cluster.engine import ClusterEngine
from gateway.cluster.members import Member
from gateway.cluster.placement import (
    HEAT_FLOOR_RPS,
    TenantDemand,
    WorkerSlot,
    heat_level,
    hrw_order,
    place,
)
from gateway.cluster.placer import TenantPin, placement_key

BLOCK = 16


def test_rates_under_the_floor_do_not_reorder_cold_tenants() -> None:
    assert heat_level(0.0) == heat_level(0.02) == heat_level(HEAT_FLOOR_RPS * 0.99) == 0
    assert 0 < heat_level(HEAT_FLOOR_RPS) < heat_level(HEAT_FLOOR_RPS * 4) < heat_level(10.0)
    workers = [WorkerSlot("w0", 20), WorkerSlot("w1", 20)]  # room for 8 of 12 tenants

    def plan(cold_rates: list[float]) -> dict[str, tuple[str, ...]]:
        cold = [TenantDemand(f"c{i}", 5, 1, heat_level(r)) for i, r in enumerate(cold_rates)]
        return place(workers, [*cold, TenantDemand("hot", 5, 1, heat_level(3.0))]).sets

    # two load windows of Poisson noise on the same cold tenants (a few requests each)
    a = plan([0.0, 0.08, 0.17, 0.0, 0.08, 0.0, 0.17, 0.08, 0.0, 0.08, 0.17])
    b = plan([0.17, 0.0, 0.08, 0.08, 0.0, 0.17, 0.0, 0.0, 0.17, 0.0, 0.08])
    assert a == b
    assert a["hot"]  # a hot tenant still wins room first


def _member(wid: str) -> Member:
    info = WorkerInfo(wid, "boot", BLOCK, 4096, 128, 64)
    client = WorkerClient(f"http://{wid}", "token", None)  # type: ignore[arg-type]
    return Member(f"http://{wid}", client, info=info, healthy=True)


def _engine() -> ClusterEngine:
    info = WorkerInfo("w0", "boot", BLOCK, 4096, 128, 64)
    eng = ClusterEngine(("http://w0", "http://w1"), "token", tokenizer=None, info=info)
    eng.members = {m.url: m for m in (_member("w0"), _member("w1"))}
    return eng


def _cached_on(eng: ClusterEngine, wid: str, ns: str, ids: list[int]) -> None:
    n = (len(ids) - 1) // BLOCK
    keys = block_keys(root_key(ns), ids, BLOCK, 0, n)
    eng.index.apply(wid, kv_events([[STORED, ns, k.hex(), None] for k in keys]))


def test_a_tenant_pinned_nowhere_goes_where_its_prompt_is_cached() -> None:
    ns, system = "ns-cold", [(i * 13) % 1500 + 3 for i in range(4 * BLOCK)]
    key = placement_key(ns)
    eng = _engine()
    pin = TenantPin("cold", ns, tuple(system), BLOCK)  # no handles: no room anywhere
    eng.placer.pins[key] = pin
    far = hrw_order(key, ["w0", "w1"])[-1]  # not where hashing alone would send it
    _cached_on(eng, far, ns, [*system, 7])
    route = eng._route(key, ns, [*system, 5, 6, 7], set())
    assert (route.member.worker_id, route.reason) == (far, "affinity")
    # pinned somewhere: holding just the system prompt is no reason to leave the placement
    near = hrw_order(key, ["w0", "w1"])[0]
    pin.handles[near] = ("boot", None)  # type: ignore[assignment]
    eng.placer.placement = place([WorkerSlot("w0", 64), WorkerSlot("w1", 64)], [])
    eng.placer.placement.sets[key] = (near,)
    route = eng._route(key, ns, [*system, 5, 6, 7], set())
    assert (route.member.worker_id, route.reason) == (near, "placement")
