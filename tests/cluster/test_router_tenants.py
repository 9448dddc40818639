"""The router spreads one tenant's burst over its placement set (per-tenant outstanding work)."""

from __future__ import annotations

from engine.remote.client import WorkerClient
from engine.remote.messages import WorkerInfo
from gateway.cluster.members import Member
from gateway.cluster.router import choose


def _member(wid: str) -> Member:
    info = WorkerInfo(wid, "boot", 16, 4096, 128, 64)
    client = WorkerClient(f"http://{wid}", "token", None)  # type: ignore[arg-type]
    return Member(f"http://{wid}", client, info=info, healthy=True)


def test_a_burst_spreads_over_the_placement_set_and_spares_the_other_tenant() -> None:
    w0, w1, w2 = (_member(w) for w in ("w0", "w1", "w2"))
    w1.add_work("quiet", 1000)  # another tenant's work on w1
    placed = ("w0", "w1")
    counts = {"w0": 0, "w1": 0}
    for _ in range(20):  # tenant "burst", 100 tokens each, still outstanding
        route = choose([w0, w1, w2], placed, "k", (), 10.0, "burst")
        assert route is not None and route.reason == "placement"
        counts[route.member.worker_id] += 1
        route.member.add_work("burst", 100)
        route.member.check_integrity()
    # By outstanding tokens alone w0 would take 15 of 20 (until it matched quiet's 1000);
    # counting the burst's own work twice, it balances its share of both engines sooner.
    assert counts == {"w0": 13, "w1": 7}
    assert w2.inflight == 0  # never outside the placement set while the set is fresh
    for m in (w0, w1):
        for _ in range(counts[m.worker_id]):
            m.end_work("burst", 100)
        m.check_integrity()
    assert not w0.tenant_tokens and w1.tenant_tokens == {"quiet": 1000}
    assert (w0.local_tokens, w1.local_tokens, w1.inflight) == (0, 1000, 1)
