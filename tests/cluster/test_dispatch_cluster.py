"""Fair admission through ``ClusterEngine`` over a real worker process: the bound holds, and
requests waiting for the worker are served by tenant counters, not in arrival order."""

from __future__ import annotations

import asyncio

from engine.api import GenerateOptions
from engine.params import SamplingParams
from gateway.cluster.dispatch import Dispatcher
from gateway.cluster.engine import ClusterEngine
from gateway.cluster.local import LocalWorker
from tests.cluster.workers import cluster_engine

PARAMS = SamplingParams(max_tokens=4, temperature=0.0, ignore_eos=True)


def prompt(seed: int) -> list[int]:
    return [(seed * 131 + i * 7) % 1500 + 3 for i in range(32)]


async def served(
    eng: ClusterEngine, rid: str, tenant: str, order: list[str], gate: asyncio.Event | None = None
) -> int:
    """``rid`` generated; with ``gate``, its slot is held after its first output until the gate
    opens (the rest of the test's requests are all waiting by then)."""
    opts = GenerateOptions(namespace=f"ns-dispatch-{tenant}", request_id=rid, tenant=tenant)
    last = None
    async for out in eng.generate(prompt(sum(map(ord, rid))), PARAMS, opts):
        if last is None:
            order.append(rid)  # its first output: it got the worker's slot
            if gate is not None:
                await gate.wait()
        for m in eng.members.values():
            assert m.inflight <= 1
        eng.check_integrity()
        last = out
    assert last is not None and last.finished
    return len(last.token_ids)


async def test_waiting_requests_are_dispatched_by_tenant_counters(
    three_workers: list[LocalWorker],
) -> None:
    eng = await cluster_engine(three_workers[:1], dispatch=Dispatcher(max_inflight=1))
    await eng.start()
    try:
        order: list[str] = []
        gate = asyncio.Event()  # a0 holds the slot until every other request waits
        tasks = [asyncio.create_task(served(eng, "a0", "a", order, gate))]
        tasks += [asyncio.create_task(served(eng, f"a{i}", "a", order)) for i in range(1, 4)]
        async with asyncio.timeout(60):
            while len(eng.dispatch.waiting) < 3:  # a0 holds the slot, a1..a3 wait
                await asyncio.sleep(0.01)
        tasks += [asyncio.create_task(served(eng, f"b{i}", "b", order)) for i in range(2)]
        async with asyncio.timeout(60):
            while len(eng.dispatch.waiting) < 5:  # b0 and b1 wait too
                await asyncio.sleep(0.01)
        gate.set()
        async with asyncio.timeout(120):
            tokens = await asyncio.gather(*tasks)
        assert tokens == [4] * 6
        # arrival order would be a0 a1 a2 a3 b0 b1; b is lifted to a's counter on arrival
        # and a0's prompt and output put a behind it
        assert order == ["a0", "b0", "a1", "b1", "a2", "a3"]
        assert not eng.dispatch.inflight and not eng.dispatch.waiting
        eng.check_integrity()
    finally:
        await eng.shutdown()
