"""Tenants placed nowhere have their prompt prefilled once, unpinned, where the router sends
them (the reconcile over recording workers, no processes)."""

from __future__ import annotations

import itertools
from collections.abc import AsyncIterator, Sequence
from typing import Any

from engine.api import GenerateOptions
from engine.core.kv import PinHandle
from engine.remote.client import WorkerInfo
from gateway.cluster.members import Member
from gateway.cluster.placement import hrw_order
from gateway.cluster.placer import Placer, TenantPin

BLOCK = 16
_ids = itertools.count()


class RecordingWorker:
    """The worker calls a reconcile makes: pins held (by namespace) and prefills, recorded."""

    def __init__(self) -> None:
        self.pinned: dict[int, str] = {}
        self.prefilled: list[str] = []

    async def pin(self, namespace: str, token_ids: Sequence[int]) -> PinHandle:
        handle = PinHandle(next(_ids), namespace, (), len(token_ids))
        self.pinned[handle.pin_id] = namespace
        return handle

    async def unpin(self, handle: PinHandle) -> None:
        del self.pinned[handle.pin_id]

    async def generate(
        self, token_ids: Sequence[int], params: Any, options: GenerateOptions
    ) -> AsyncIterator[None]:
        assert params.max_tokens == 1 and not options.interim
        self.prefilled.append(options.namespace)
        yield None


def _members(ids: Sequence[str], budget: int, boot: str = "b1") -> dict[str, Member]:
    out = {}
    for wid in ids:
        info = WorkerInfo(wid, boot, BLOCK, 4096, 2 * budget, budget)
        out[wid] = Member(f"http://{wid}", RecordingWorker(), info=info, healthy=True)  # type: ignore[arg-type]
    return out


def _tenants(placer: Placer, n: int) -> list[TenantPin]:
    pins = [TenantPin(f"t{i}", f"ns-warm-{i}", tuple(range(4 * BLOCK)), BLOCK) for i in range(n)]
    placer.pins.update({p.key: p for p in pins})
    return pins


def _prefilled(members: dict[str, Member]) -> list[tuple[str, str]]:
    return sorted((w, ns) for w, m in members.items() for ns in m.client.prefilled)  # type: ignore[attr-defined]


async def test_an_unplaced_tenant_is_warmed_once_on_its_rendezvous_first_worker() -> None:
    members = _members(["w0", "w1"], budget=4)  # one 4-block tenant per worker
    placer = Placer(replica_rate=2.0)
    pins = _tenants(placer, 3)
    await placer.reconcile(members, {})
    await placer.warmed()
    placer.check_integrity()
    (cold,) = [p for p in pins if not placer.placement.workers_of(p.key)]
    assert not cold.handles
    first = hrw_order(cold.key, members)[0]
    assert _prefilled(members) == [(first, cold.namespace)]
    await placer.reconcile(members, {})  # still there: not again
    await placer.warmed()
    assert _prefilled(members) == [(first, cold.namespace)]
    assert placer.warms == 1

    # the cold tenant heats up and takes a placed one's room: that one keeps its blocks
    # where it was pinned (the router follows them there), so it is not prefilled anywhere
    held = {p.key: p.workers(members) for p in pins}
    await placer.reconcile(members, {cold.key: 1.0})
    await placer.warmed()
    placer.check_integrity()
    assert cold.workers(members) == [first]
    (loser,) = [p for p in pins if not placer.placement.workers_of(p.key)]
    assert not loser.handles and len(held[loser.key]) == 1
    assert placer.left_on[loser.key] == (held[loser.key][0], "b1")
    assert placer.warms == 1


async def test_a_warmed_prompt_is_warmed_again_when_its_worker_leaves_or_restarts() -> None:
    members = _members(["w0", "w1", "w2"], budget=4)
    placer = Placer(replica_rate=2.0)
    pins = _tenants(placer, 4)
    await placer.reconcile(members, {})
    await placer.warmed()
    (cold,) = [p for p in pins if not placer.placement.workers_of(p.key)]
    where = placer.left_on[cold.key][0]
    rest = {w: m for w, m in members.items() if w != where}
    await placer.reconcile(rest, {})  # its holder left: its pins moved, its room went too
    await placer.warmed()
    placer.check_integrity()
    unplaced = [p for p in pins if not placer.placement.workers_of(p.key)]
    assert cold in unplaced and len(unplaced) == 2
    assert all(placer.left_on[p.key][0] in rest for p in unplaced)
    # a restarted worker (new boot) lost what was warmed there
    restarted = _members(["w0", "w1", "w2"], budget=4, boot="b2")
    before = placer.warms
    await placer.reconcile(restarted, {})
    await placer.warmed()
    unplaced = [p for p in pins if not placer.placement.workers_of(p.key)]
    assert placer.warms == before + len(unplaced) == before + 1


async def test_warming_can_be_turned_off() -> None:
    members = _members(["w0", "w1"], budget=4)
    placer = Placer(replica_rate=2.0)
    placer.warm_unplaced = False
    _tenants(placer, 3)
    await placer.reconcile(members, {})
    await placer.warmed()
    assert _prefilled(members) == [] and placer.warms == 0
