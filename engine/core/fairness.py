"""Per-tenant fair share for the scheduler: Virtual Token Counters (no torch).

VTC (Sheng et al., "Fairness in Serving Large Language Models", OSDI 2024): every tenant has a
counter of the service it received, in *virtual* tokens (the cost of what was computed for it,
in token equivalents, / the tenant's weight; the paper charges a function of the input and
output token counts, this one the FLOPs the chunk takes, context included).
The scheduler admits from the waiting queue the request of the tenant with the lowest counter
and preempts from the tenant with the highest one; whoever is waiting is served (work
conserving), so a lone tenant gets the whole engine and backlogged tenants converge to service
proportional to their weights.

What counts: what every chunk the scheduler puts into a step costs the model for the tenant
(``StepCost``, engine/core/step_cost.py: FLOPs of the model's geometry in token equivalents),
charged when it is scheduled (a scheduled chunk always runs): its tokens, the keys each of them
attends to (a cached prefix included) and the LM head of a sampled token. Tokens attached from the
prefix cache are not computed, so not charged as tokens; every chunk and decode that reads them
pays for reading them, so a tenant decoding over a long cached context is charged what that
costs, not 1 per token like a tenant with a short one. A preempted request's recompute is
charged (it is compute the tenant's request really takes).

Counters steer every place service is handed out, not only admission: a step's budget is split
over decodes, prefill chunks and admissions by counter (``plan_step``), and when the running
slots are the limit a slot moves from the most served tenant to a waiting one that is far
behind (``slot_victim``); otherwise a tenant holding many running requests would keep decoding
in all of them whatever its counter.

The lift: a tenant that becomes active (its first unfinished request arrives) is raised to at
least the lowest counter of the tenants active now, so time spent idle is not credit it could
later spend starving the others. When no tenant is active every counter is dropped (nobody has
a claim on anybody), which also bounds the state; an inactive tenant whose counter is at or below
the lowest active one is dropped too (the lift would give it that value anyway).

Priority classes: ``interactive`` requests are admitted before ``batch`` ones; a batch request
that has waited ``batch_max_wait_steps`` scheduler steps is *aged* and competes as interactive
(the starvation bound, docs/contracts.md).
"""

from __future__ import annotations

import heapq
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field
from typing import Literal, NamedTuple, Protocol

from engine.core.step_cost import StepCost

Priority = Literal["interactive", "batch"]
PRIORITIES: tuple[Priority, ...] = ("interactive", "batch")


@dataclass
class TenantState:
    weight: float = 1.0
    counter: float = 0.0  # virtual service: cost (token equivalents) / weight
    active: int = 0  # unfinished requests (waiting + running)
    waiting: int = 0  # of which in the waiting queue
    served_tokens: int = 0  # real tokens computed (reports, tests)


@dataclass
class FairShare:
    """The counters; the scheduler calls ``arrive``/``depart``/``charge`` and reads the rest.
    ``cost``: what a chunk costs (the runner's model; counting tokens by default)."""

    tenants: dict[str, TenantState] = field(default_factory=dict)
    cost: StepCost = field(default_factory=StepCost)

    def arrive(self, tenant: str, weight: float) -> None:
        """A request of ``tenant`` entered the scheduler (``weight``: the latest one wins)."""
        if not weight > 0:
            raise ValueError(f"a tenant's weight must be > 0, got {weight}")
        state = self.tenants.get(tenant)
        if state is None or state.active == 0:
            floor = self.min_active_counter()
            if state is None:
                state = self.tenants[tenant] = TenantState()
            if floor is not None:
                state.counter = max(state.counter, floor)  # the VTC lift
        state.weight = weight
        state.active += 1
        state.waiting += 1

    def depart(self, tenant: str, *, was_waiting: bool) -> None:
        """A request of ``tenant`` finished (or was aborted)."""
        state = self.tenants[tenant]
        state.active -= 1
        if was_waiting:
            state.waiting -= 1
        if state.active == 0:
            self._prune()

    def admitted(self, tenant: str) -> None:
        self.tenants[tenant].waiting -= 1

    def requeued(self, tenant: str) -> None:
        self.tenants[tenant].waiting += 1

    def charge(self, tenant: str, num_tokens: int, start: int = 0, sampled: bool = False) -> None:
        """``tenant``'s chunk of ``num_tokens`` tokens at positions from ``start`` is in a step
        (``sampled``: it ends in a sampled token)."""
        state = self.tenants[tenant]
        state.counter += self.cost.chunk(start, num_tokens, sampled) / state.weight
        state.served_tokens += num_tokens

    def counter(self, tenant: str) -> float:
        return self.tenants[tenant].counter

    def waiting_of(self, tenant: str) -> int:
        """Requests of ``tenant`` in the waiting queue (read by other threads: one dict get)."""
        state = self.tenants.get(tenant)
        return 0 if state is None else state.waiting

    def min_active_counter(self) -> float | None:
        counters = [s.counter for s in self.tenants.values() if s.active > 0]
        return min(counters) if counters else None

    def _prune(self) -> None:
        floor = self.min_active_counter()
        if floor is None:
            self.tenants.clear()
            return
        for name in [n for n, s in self.tenants.items() if s.active == 0 and s.counter <= floor]:
            del self.tenants[name]

    def check_integrity(self, active: Iterable[tuple[str, bool]]) -> None:
        """``active``: (tenant, is waiting) of every unfinished request."""
        counts: dict[str, list[int]] = {}
        for tenant, waiting in active:
            c = counts.setdefault(tenant, [0, 0])
            c[0] += 1
            c[1] += int(waiting)
        for name, state in self.tenants.items():
            got = counts.get(name, [0, 0])
            assert [state.active, state.waiting] == got, (
                f"tenant {name!r}: counted {state.active} active / {state.waiting} waiting, "
                f"holds {got[0]} / {got[1]}"
            )
            assert state.weight > 0 and state.counter >= 0
        missing = set(counts) - set(self.tenants)
        assert not missing, f"tenants with requests but no counter: {sorted(missing)}"
        floor = self.min_active_counter()
        if floor is None:
            assert not self.tenants, "counters kept with no tenant active"


def is_eligible(req: FairRequest, step: int, max_wait_steps: int) -> bool:
    """Competes as interactive: interactive, or a batch request waiting past its bound."""
    return req.priority == "interactive" or step - req.enqueued_step >= max_wait_steps


class FairRequest(Protocol):
    """What the policy reads of a request (engine/core/request.py's Request has these)."""

    @property
    def tenant(self) -> str: ...

    @property
    def priority(self) -> Priority: ...

    @property
    def enqueued_step(self) -> int: ...

    @property
    def admit_seq(self) -> int: ...

    @property
    def request_id(self) -> str: ...


def heads(waiting: Iterable[FairRequest]) -> list[tuple[int, FairRequest]]:
    """The first waiting request of every tenant and priority class, with its queue position
    (a tenant's requests leave in queue order, preempted ones first: they were put first)."""
    seen: set[tuple[str, Priority]] = set()
    out: list[tuple[int, FairRequest]] = []
    for pos, req in enumerate(waiting):
        key = (req.tenant, req.priority)
        if key not in seen:
            seen.add(key)
            out.append((pos, req))
    return out


def pick_waiting(
    fair: FairShare, waiting: Iterable[FairRequest], step: int, max_wait_steps: int
) -> FairRequest:
    """Next to admit: aged batch requests first (the starvation bound), then interactive, then
    batch; within a class the lowest virtual counter, then queue order."""

    def rank(pr: tuple[int, FairRequest]) -> tuple[int, float, int]:
        r = pr[1]
        cls = 1 if r.priority == "interactive" else 0 if is_eligible(r, step, max_wait_steps) else 2
        return cls, fair.counter(r.tenant), pr[0]

    return min(heads(waiting), key=rank)[1]


def pick_victim(fair: FairShare, candidates: Iterable[FairRequest]) -> FairRequest:
    """Preempt batch before interactive, then the highest counter, then the newest admission."""
    return max(
        candidates,
        key=lambda r: (r.priority == "batch", fair.counter(r.tenant), r.admit_seq),
    )


def underserved(
    fair: FairShare,
    waiting: Iterable[FairRequest],
    running_tenants: set[str],
    step: int,
    max_wait_steps: int,
) -> set[str]:
    """Tenants with an eligible waiting request whose counter is at most that of every other
    tenant now running: while there are any, the others' prefill is cut to a small budget and
    their decode rows to a few, so that the waiting request is admitted in a short step instead
    of after a long one (the least served tenant only: VTC would serve it first anyway, so
    weights are kept)."""
    if not running_tenants:
        return set()
    out: set[str] = set()
    for _, req in heads(waiting):
        t = req.tenant
        if t in out or not is_eligible(req, step, max_wait_steps):
            continue
        c = fair.counter(t)
        others = [fair.counter(u) for u in running_tenants if u != t]
        if others and c <= min(others):  # the least served (a lifted newcomer always is)
            out.add(t)
    return out


class Want(NamedTuple):
    """A request's claim on a step: ``need`` tokens (1 for a decode; a waiting request's whole
    prompt, its cached prefix not known yet) from position ``start`` (what they attend to: a
    decode's context), ``late``: batch and not aged (served after the tenant's interactive
    work)."""

    request_id: str
    tenant: str
    late: bool
    need: int
    waiting: bool
    start: int = 0


def plan_step(
    fair: FairShare,
    wants: list[Want],
    budget: int,
    free_slots: int,
    under: set[str],
    cap: int,
    rows: int | None = None,
) -> tuple[dict[str, int], int]:
    """Split a step's ``budget`` by virtual counter over running requests (decodes and prefill
    chunks alike) and waiting ones (at most ``free_slots`` of them): the least served tenant's
    next claim gets what it needs (tokens of the budget), its counter advanced by what that
    costs as the step will charge it (``fair.cost``: a decode over a long context costs more),
    then the least served again. A tenant's claims go interactive before batch, running before
    waiting, each in the order given (admission order, queue order). So when the budget is
    short the tokens go to the tenants that are behind, not to the oldest admissions.
    Tenants not in ``under`` share at most ``cap`` prefill tokens of running requests while
    ``under`` is not empty, and, once an under-served tenant's claim is in the step, at most
    ``rows`` decode rows (None: all; a decode row costs the LM head and its attention, so a step
    of many stays long however small its prefill; the admission loop caps their new requests
    itself). Returns the allowance per running request id (what is planned for the
    waiting is what the running requests leave to admission) and what is left of ``cap``."""
    queues: dict[str, list[tuple[bool, bool, int, Want]]] = {}
    for i, w in enumerate(wants):
        queues.setdefault(w.tenant, []).append((w.late, w.waiting, i, w))
    heap: list[tuple[bool, float, int, str]] = []
    for tenant, q in queues.items():
        q.sort(reverse=True)  # popped from the end
        heapq.heappush(heap, (q[-1][0], fair.counter(tenant), q[-1][2], tenant))
    allow: dict[str, int] = {}
    # an under-served tenant's admission or prefill chunk can run in this step: the rows cap
    # keeps the step short for it
    helped = rows is not None and any(
        w.tenant in under and (free_slots > 0 if w.waiting else w.need > 1) for w in wants
    )
    while heap and budget > 0:
        _, virtual, _, tenant = heapq.heappop(heap)
        q = queues[tenant]
        w = q.pop()[3]
        other = bool(under) and tenant not in under and not w.waiting
        capped = other and w.need > 1
        give = min(w.need, budget, cap) if capped else min(w.need, budget)
        if other and w.need == 1 and helped:
            give, rows = (give, rows - 1) if rows else (0, 0)
        if w.waiting:
            give = give if free_slots > 0 else 0
            free_slots -= 1
        if give >= 1:
            if not w.waiting:
                allow[w.request_id] = give
            budget -= give
            cap -= give if capped else 0
            virtual += fair.cost.chunk(w.start, give, give == w.need) / fair.tenants[tenant].weight
        if q:
            heapq.heappush(heap, (q[-1][0], virtual, q[-1][2], tenant))
    return allow, cap


def slot_victim(
    fair: FairShare,
    waiting: Iterable[FairRequest],
    running: Sequence[FairRequest],
    step: int,
    max_wait_steps: int,
    costs: Callable[[FairRequest], float],
) -> FairRequest | None:
    """Every running slot is taken and a tenant behind the others waits: the running request to
    preempt so that it gets a slot now, or None. Without this a tenant holding many slots keeps
    decoding in all of them whatever its counter, and the slots change hands only as requests
    finish. The victim is ``pick_victim``'s among the other tenants' running requests, and only
    if the counters differ by more than the waiting request's and the victim's costs together
    (``costs``: what each takes at most, in the counters' unit, a preempted victim recomputing
    what the prefix cache no longer holds): after the swap the waiting tenant is still the less
    served, so the slot is never traded back and forth, and a gap that one request's turnover
    closes is left to admission (preemption is rare: it costs recompute)."""
    heads_ = [r for _, r in heads(waiting) if is_eligible(r, step, max_wait_steps)]
    if not heads_:
        return None
    cand = pick_waiting(fair, heads_, step, max_wait_steps)
    others = [r for r in running if r.tenant != cand.tenant]
    if not others:
        return None
    victim = pick_victim(fair, others)
    gap = fair.counter(victim.tenant) - fair.counter(cand.tenant)
    swap = costs(cand) / fair.tenants[cand.tenant].weight
    swap += costs(victim) / fair.tenants[victim.tenant].weight
    return victim if gap > swap else None
