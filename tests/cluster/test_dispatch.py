"""The dispatcher in front of replicas (gateway/cluster/dispatch.py): bounds and fair order.

Real asyncio tasks acquire slots; the replicas are names (the dispatcher's own logic: which
request gets the next free slot, and never more than the bound on a replica).
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable, Sequence

import pytest

from engine.api import Priority
from engine.errors import EngineOverloaded
from gateway.cluster.dispatch import Dispatcher, Entry, Pick, Slot, with_room
from gateway.cluster.members import Member

PROMPT = 100


def on(*replicas: str) -> Pick:
    """A request that may go to ``replicas`` (the first with room)."""

    def pick(room: Callable[[str], bool]) -> str | None:
        return next((r for r in replicas if room(r)), None)

    return pick


class Run:
    """Requests as tasks; ``order``: request ids in the order they got their slot."""

    def __init__(self, d: Dispatcher) -> None:
        self.d = d
        self.order: list[str] = []
        self.slots: dict[str, Slot] = {}
        self.tasks: dict[str, asyncio.Task[Slot]] = {}

    async def ask(
        self,
        rid: str,
        tenant: str,
        pick: Pick | None = None,
        *,
        weight: float = 1.0,
        priority: Priority = "interactive",
    ) -> None:
        entry = Entry(rid, tenant, weight, priority, PROMPT)
        task = asyncio.create_task(self.d.acquire(entry, pick or on("r0")))
        task.add_done_callback(lambda t: self._got(rid, t))
        self.tasks[rid] = task
        await asyncio.sleep(0)  # it runs up to its wait (or its slot)
        await asyncio.sleep(0)

    def _got(self, rid: str, task: asyncio.Task[Slot]) -> None:
        if not task.cancelled() and task.exception() is None:
            self.order.append(rid)
            self.slots[rid] = task.result()

    async def finish(self, rid: str, generated: int = 10) -> None:
        self.d.release(self.slots.pop(rid), generated)
        await asyncio.sleep(0)
        await asyncio.sleep(0)
        self.check()

    async def drain(self) -> None:
        """Finish requests in the order they got slots until every one has run."""
        while self.slots:
            await self.finish(next(r for r in self.order if r in self.slots))
        assert all(t.done() for t in self.tasks.values())

    def check(self) -> None:
        self.d.check_integrity(held=len(self.slots))


async def test_a_replica_never_holds_more_than_its_bound() -> None:
    run = Run(Dispatcher(max_inflight=2))
    for i in range(5):
        await run.ask(f"q{i}", "a")
        run.check()
    assert run.order == ["q0", "q1"] and run.d.inflight["r0"] == 2 and len(run.d.waiting) == 3
    await run.finish("q0")
    assert run.order == ["q0", "q1", "q2"] and run.d.inflight["r0"] == 2
    await run.drain()
    assert run.order == [f"q{i}" for i in range(5)] and not run.d.inflight
    assert not run.d.fair.tenants  # nobody active: every counter dropped


async def test_no_bound_means_nobody_waits() -> None:
    run = Run(Dispatcher(max_inflight=0))
    for i in range(50):
        await run.ask(f"q{i}", f"t{i % 3}")
    assert len(run.order) == 50 and run.d.inflight["r0"] == 50
    await run.drain()


async def test_a_flooding_tenant_does_not_hold_back_a_later_one() -> None:
    run = Run(Dispatcher(max_inflight=1))
    for i in range(6):
        await run.ask(f"a{i}", "a")
    for i in range(3):
        await run.ask(f"b{i}", "b")
    await run.drain()
    # first come, first served would run b0..b2 last; by counter they alternate with a's (b is
    # lifted to a's counter on arrival, a0's 10 generated tokens put a behind b)
    assert run.order == ["a0", "b0", "a1", "b1", "a2", "b2", "a3", "a4", "a5"]


async def test_weights_split_the_slots() -> None:
    run = Run(Dispatcher(max_inflight=1))
    await run.ask("first", "x")  # holds the slot while both tenants queue up
    for i in range(6):
        await run.ask(f"h{i}", "heavy", weight=2.0)
        await run.ask(f"l{i}", "light", weight=1.0)
    await run.drain()
    served = [r[0] for r in run.order[1:10]]
    assert served.count("h") == 2 * served.count("l")  # 2:1 while both wait


async def test_interactive_goes_first_and_batch_ages() -> None:
    run = Run(Dispatcher(max_inflight=1, batch_max_wait=3))
    await run.ask("hold", "x")
    await run.ask("bat", "b", priority="batch")
    for i in range(5):
        await run.ask(f"i{i}", "i")
    await run.drain()
    # the batch request waits while interactive ones go, until 3 dispatches passed it
    assert run.order == ["hold", "i0", "i1", "i2", "bat", "i3", "i4"]


async def test_a_full_replica_does_not_block_requests_for_another() -> None:
    run = Run(Dispatcher(max_inflight=1))
    await run.ask("a0", "a", on("r0"))
    await run.ask("a1", "a", on("r0"))  # waits for r0
    await run.ask("b0", "b", on("r1"))  # r1 has room: goes, though a1 waited first
    assert run.order == ["a0", "b0"] and run.d.inflight == {"r0": 1, "r1": 1}
    await run.drain()
    assert sorted(run.order) == ["a0", "a1", "b0"]


async def test_cancelled_while_waiting_holds_nothing() -> None:
    run = Run(Dispatcher(max_inflight=1))
    await run.ask("a0", "a")
    await run.ask("a1", "a")
    await run.ask("b0", "b")
    run.tasks["a1"].cancel()
    await asyncio.sleep(0)
    run.check()
    assert len(run.d.waiting) == 1
    await run.drain()
    assert run.order == ["a0", "b0"]


async def test_cancelled_after_its_slot_was_taken_gives_it_back() -> None:
    run = Run(Dispatcher(max_inflight=1))
    await run.ask("a0", "a")
    await run.ask("a1", "a")
    run.d.release(run.slots.pop("a0"), 5)  # a1's slot is taken for it, it has not run yet
    run.tasks["a1"].cancel()
    await asyncio.sleep(0)
    await asyncio.sleep(0)
    run.check()
    assert run.tasks["a1"].cancelled() and not run.d.inflight and not run.d.waiting
    assert not run.d.fair.tenants


async def test_too_many_waiting_is_refused() -> None:
    run = Run(Dispatcher(max_inflight=1, max_waiting=2))
    for i in range(3):
        await run.ask(f"q{i}", "a")
    with pytest.raises(EngineOverloaded):
        await run.d.acquire(Entry("q3", "a"), on("r0"))
    run.check()
    await run.drain()


async def test_a_pick_that_fails_fails_its_request_only() -> None:
    def gone(room: Callable[[str], bool]) -> str | None:
        raise LookupError("no replica")

    run = Run(Dispatcher(max_inflight=1))
    await run.ask("a0", "a")
    await run.ask("a1", "a", gone)
    await run.ask("b0", "b")
    await run.finish("a0")
    assert isinstance(run.tasks["a1"].exception(), LookupError)
    assert run.order == ["a0", "b0"]
    await run.drain()


def members(*ids: str) -> Sequence[Member]:
    out = []
    for wid in ids:
        m = Member(wid, client=None)  # type: ignore[arg-type]  # with_room reads ids only
        out.append(m)
    return out


def test_with_room_keeps_a_tenant_on_its_own_workers() -> None:
    ms = members("w0", "w1", "w2")
    full = {"w0"}

    def room(w: str) -> bool:
        return w not in full

    assert [m.worker_id for m in with_room(ms, ["w0", "w1"], (), room)] == ["w1", "w2"]
    assert with_room(ms, ["w0"], (), room) == []  # its set is full: it waits for it
    assert [m.worker_id for m in with_room(ms, ["w0"], {"w2"}, room)] == ["w1", "w2"]
    assert [m.worker_id for m in with_room(ms, [], (), room)] == ["w1", "w2"]  # placed nowhere
    assert [m.worker_id for m in with_room(ms, ["gone"], (), room)] == ["w1", "w2"]
