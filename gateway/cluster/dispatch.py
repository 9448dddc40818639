"""Tenant-fair admission in front of replicas the gateway does not schedule (vLLM servers).

A kvgate worker schedules its own requests fairly (engine/core/fairness.py); a vLLM server
serves its queue first come, first served (or by a priority number). So the gateway holds the
queue: each replica takes at most ``max_inflight`` of this gateway's requests at a time, and a
request whose candidate replicas are all full waits here. When a slot frees, the waiting
requests are dispatched in the engine's own fair-share order: the same ``FairShare`` counters
and ``pick_waiting`` (through engine/api.py), not a second policy::

    acquire(entry, pick) ── room on a replica pick chooses? ── yes ──> Slot (replica, counted)
                                 │ no
                                 v
        waiting queue (arrival order) ── a slot frees (release) or a request arrives:
            next = pick_waiting(fair, waiting not yet tried this round)
                   (aged batch, then interactive, then batch; lowest virtual counter; queue order)
            pick(room) -> a replica with room: the slot is taken for it and it wakes up
                       -> None: its candidates are full, its (tenant, class) sits out this round
                       -> raises: the request fails with that error

What a tenant is charged (in tokens, the counters' unit here, per weight): its prompt when it is
dispatched, its generated tokens when it ends. The aging clock counts dispatches out of the
queue: a batch request waiting while ``batch_max_wait`` others were dispatched competes as
interactive (the engine's ``batch_max_wait_steps``, with a dispatch for a step).

A slot is taken for a waiting request before it wakes up, so nobody arriving in between can
take it (no queue jumping). Bounds are per gateway: with several gateways, each holds its own
share of a replica (``KVGATE_BACKEND_MAX_INFLIGHT``, docs/operations.md).
"""

from __future__ import annotations

import asyncio
import itertools
from collections import Counter
from collections.abc import Callable, Collection, Sequence
from dataclasses import dataclass, field

from engine.api import FairShare, Priority, pick_waiting
from engine.errors import EngineOverloaded
from gateway.cluster.members import Member

# Given "has this replica (worker id) room?", the replica to take, or None: every candidate of
# the request is full. It may raise (no replica at all): the request fails with that error.
Pick = Callable[[Callable[[str], bool]], str | None]


def with_room(
    members: Sequence[Member],
    placed: Collection[str],
    affinity: Collection[str],
    room: Callable[[str], bool],
) -> list[Member]:
    """The candidates of a request that have room. A tenant whose own workers (its placement
    set, the workers holding its conversation) are all full waits for one of them rather than
    going where its prompt is not cached: empty then. A tenant with none goes anywhere."""
    live = {m.worker_id for m in members}
    own = [w for w in (*placed, *affinity) if w in live]
    if own and not any(room(w) for w in own):
        return []
    return [m for m in members if room(m.worker_id)]


@dataclass(frozen=True)
class Entry:
    """Who asks for a slot: the fair share's tenant, weight and class, and the prompt's size."""

    request_id: str
    tenant: str = "default"
    weight: float = 1.0
    priority: Priority = "interactive"
    prompt_tokens: int = 0


@dataclass(frozen=True)
class Slot:
    """A replica's slot held by one request; give it back with ``Dispatcher.release``."""

    replica: str
    entry: Entry


@dataclass(eq=False)
class _Waiter:
    """A waiting request as ``pick_waiting`` reads it (engine/core/fairness.py's FairRequest)."""

    entry: Entry
    pick: Pick
    enqueued_step: int
    admit_seq: int
    future: asyncio.Future[Slot]

    @property
    def tenant(self) -> str:
        return self.entry.tenant

    @property
    def priority(self) -> Priority:
        return self.entry.priority

    @property
    def request_id(self) -> str:
        return self.entry.request_id


@dataclass
class Dispatcher:
    """``max_inflight``: slots per replica (0: no bound, nobody waits); ``max_waiting``: more
    waiting than this and a request is refused (``EngineOverloaded``, 503)."""

    max_inflight: int = 0
    batch_max_wait: int = 64
    max_waiting: int = 1024
    fair: FairShare = field(default_factory=FairShare)
    inflight: Counter[str] = field(default_factory=Counter)  # replica -> slots held
    waiting: list[_Waiter] = field(default_factory=list)  # arrival order
    dispatched: int = 0  # out of the queue: the aging clock
    _seq: itertools.count[int] = field(default_factory=itertools.count)

    def has_room(self, replica: str) -> bool:
        return self.max_inflight == 0 or self.inflight[replica] < self.max_inflight

    async def acquire(self, entry: Entry, pick: Pick) -> Slot:
        """A slot on the replica ``pick`` chooses among those with room; waits while there is
        none (in fair order with the others waiting). Cancelled while waiting: nothing held."""
        if len(self.waiting) >= self.max_waiting:
            raise EngineOverloaded(f"{len(self.waiting)} requests wait for a replica")
        self.fair.arrive(entry.tenant, entry.weight)
        if not self.waiting:  # nobody ahead: no order to keep
            try:
                replica = pick(self.has_room)
            except BaseException:
                self.fair.depart(entry.tenant, was_waiting=True)
                raise
            if replica is not None:
                return self._grant(entry, replica)
        fut: asyncio.Future[Slot] = asyncio.get_running_loop().create_future()
        self.waiting.append(_Waiter(entry, pick, self.dispatched, next(self._seq), fut))
        self._pump()
        try:
            return await fut
        except asyncio.CancelledError:
            self._cancelled(fut)
            raise

    def release(self, slot: Slot, generated_tokens: int = 0) -> None:
        """The request ended (or failed): its slot is free; ``generated_tokens`` are charged."""
        entry = slot.entry
        self.inflight[slot.replica] -= 1
        if self.inflight[slot.replica] == 0:
            del self.inflight[slot.replica]
        if generated_tokens > 0:
            self.fair.charge(entry.tenant, generated_tokens)
        self.fair.depart(entry.tenant, was_waiting=False)
        self._pump()

    def poke(self) -> None:
        """Replicas changed (one came up): waiting requests may fit now."""
        self._pump()

    def _grant(self, entry: Entry, replica: str) -> Slot:
        self.inflight[replica] += 1
        self.fair.admitted(entry.tenant)
        if entry.prompt_tokens > 0:
            self.fair.charge(entry.tenant, entry.prompt_tokens)
        return Slot(replica, entry)

    def _pump(self) -> None:
        """Dispatch waiting requests in fair order while any of them fits somewhere."""
        out: set[tuple[str, Priority]] = set()  # (tenant, class) whose head did not fit
        for gone in [w for w in self.waiting if w.future.done()]:
            self._drop(gone)  # cancelled; its task has not run its handler yet
        while True:
            pending = [w for w in self.waiting if (w.tenant, w.priority) not in out]
            if not pending:
                return
            w = pick_waiting(self.fair, pending, self.dispatched, self.batch_max_wait)
            assert isinstance(w, _Waiter)
            try:
                replica = w.pick(self.has_room)
            except Exception as exc:
                self._drop(w)
                w.future.set_exception(exc)
                continue
            if replica is None:
                out.add((w.tenant, w.priority))
                continue
            self.waiting.remove(w)
            self.dispatched += 1
            w.future.set_result(self._grant(w.entry, replica))

    def _drop(self, w: _Waiter) -> None:
        self.waiting.remove(w)
        self.fair.depart(w.tenant, was_waiting=True)

    def _cancelled(self, fut: asyncio.Future[Slot]) -> None:
        if fut.done() and not fut.cancelled() and fut.exception() is None:
            self.release(fut.result())  # granted, but its request is gone before it ran
            return
        for w in self.waiting:
            if w.future is fut:
                self._drop(w)
                self._pump()  # its (tenant, class) may have held others back
                return

    def check_integrity(self, held: int | None = None) -> None:
        """``held``: the slots the caller knows are in use (None: not checked)."""
        assert all(n > 0 for n in self.inflight.values()), f"bad slot counts {self.inflight}"
        if self.max_inflight:
            assert all(n <= self.max_inflight for n in self.inflight.values()), self.inflight
        if held is not None:
            assert sum(self.inflight.values()) == held, (sum(self.inflight.values()), held)
        waiting = Counter(w.tenant for w in self.waiting)
        for name, state in self.fair.tenants.items():
            assert state.waiting == waiting.get(name, 0), (name, state.waiting, waiting)
            assert state.active >= state.waiting
        missing = set(waiting) - set(self.fair.tenants)
        assert not missing, f"waiting tenants with no counter: {sorted(missing)}"
