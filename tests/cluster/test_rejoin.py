"""A worker joining the cluster: pins converge to the placement over the grown membership."""

from __future__ import annotations

import asyncio
import time
from pathlib import Path

from gateway.cluster.engine import ClusterEngine
from gateway.cluster.local import LocalWorker
from tests.cluster.workers import cluster_engine, start_workers, stop_all

BLOCK = 16
HEALTH_S = 0.3


def prompt(tenant: int, blocks: int) -> list[int]:
    return [(tenant * 97 + i * 11) % 1500 + 3 for i in range(blocks * BLOCK)]


async def settled_within(eng: ClusterEngine, limit_s: float) -> bool:
    deadline = time.monotonic() + limit_s
    while time.monotonic() < deadline:
        if eng.placement_settled():
            return True
        await asyncio.sleep(0.05)
    return False


async def pinned_blocks(eng: ClusterEngine) -> dict[str, int]:
    await asyncio.sleep(HEALTH_S)
    await eng._check_all()  # a fresh load poll of every worker
    return {w: m.load.stats.blocks_pinned for w, m in eng.healthy().items() if m.load}


async def test_pins_converge_to_the_placement_after_a_worker_joins(demo_model_dir: Path) -> None:
    # fresh workers: pins other tests left on the shared ones would eat into the budgets
    workers: list[LocalWorker] = []
    workers += await asyncio.to_thread(start_workers, demo_model_dir, ["w0", "w1"])
    eng = await cluster_engine(workers, health_s=HEALTH_S)
    try:
        await eng.start()
        # 14 tenants x 12 blocks = 168: two workers (budget 64 each) hold 10, three hold all.
        # Pinned concurrently, as tenants activated at once are: their reconciles overlap.
        pins = await asyncio.gather(
            *(eng.pin(f"t{i}", f"ns-join-{i}", prompt(i, 12)) for i in range(14))
        )
        assert await settled_within(eng, 20 * HEALTH_S)
        assert sum(1 for p in pins if p.workers(eng.healthy())) == 10
        workers += await asyncio.to_thread(start_workers, demo_model_dir, ["w2"])
        eng.set_endpoints([w.url for w in workers])
        deadline = time.monotonic() + 60.0
        while "w2" not in eng.healthy():
            assert time.monotonic() < deadline, "the joining worker was never taken in"
            await asyncio.sleep(0.02)
        assert await settled_within(eng, 10 * HEALTH_S), [
            (p.tenant_id, p.workers(eng.healthy()), p.rejected) for p in pins
        ]
        assert all(p.workers(eng.healthy()) for p in pins)  # now every tenant fits
        assert any("w2" in p.handles for p in pins)
        eng.placer.check_integrity()
        # what the workers hold is what the placement says: no pin leaked along the way
        assert await pinned_blocks(eng) == {
            w: eng.placer.placement.used_blocks.get(w, 0) for w in ("w0", "w1", "w2")
        }
    finally:
        await eng.shutdown()
        await stop_all(workers)
