"""The fair policy's choices in a scheduler step (``scheduling="fair"``, engine/core/scheduler.py):
which waiting request is admitted next, how the step's budget is split over every claim on it,
which slot moves to a tenant far behind, how much prefill the others get while an under-served
tenant waits, in what order running requests get their blocks, and which one a KV preemption
takes. The counters and the pure rules are engine/core/fairness.py; this module applies them to
the scheduler's queues, which it reads and never changes (the scheduler acts on what it returns).
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence

from engine.config import EngineConfig
from engine.core.fairness import (
    FairShare,
    Want,
    is_eligible,
    pick_victim,
    pick_waiting,
    plan_step,
    slot_victim,
    underserved,
)
from engine.core.request import Request


class FairPolicy:
    def __init__(self, config: EngineConfig, fair: FairShare) -> None:
        self.config = config
        self.fair = fair

    def _cost_to_finish(self, req: object) -> float:
        """What a request still costs at most: its prompt (and tokens generated before a
        preemption) computed from scratch, then the output left (a cached prefix would make it
        less)."""
        assert isinstance(req, Request)
        left = req.sampling.max_tokens - req.num_output_tokens
        return self.fair.cost.to_finish(req.num_tokens, left)

    def next_waiting(self, waiting: Sequence[Request], step: int) -> Request:
        pick = pick_waiting(self.fair, waiting, step, self.config.batch_max_wait_steps)
        assert isinstance(pick, Request)
        return pick

    def plan(
        self,
        running: Sequence[Request],
        waiting: Sequence[Request],
        step: int,
        budget: int,
        under: set[str] | None,
        cap: int,
    ) -> tuple[dict[str, int], int]:
        """Each running request's tokens this step, decodes and prefill chunks alike, weighed
        against the waiting requests that free slots could admit; and the prefill cap left."""
        aged = self.config.batch_max_wait_steps
        wants = [
            Want(
                r.request_id,
                r.tenant,
                r.priority == "batch",
                r.num_tokens - r.num_computed,
                False,
                r.num_computed,
            )
            for r in running
        ]
        wants += [
            Want(r.request_id, r.tenant, not is_eligible(r, step, aged), r.num_tokens, True)
            for r in waiting
        ]
        free = self.config.max_num_seqs - len(running)
        rows = self.config.fair_decode_rows if under else None
        return plan_step(self.fair, wants, budget, free, under or set(), cap, rows)

    def slot_to_move(
        self, running: Sequence[Request], waiting: Sequence[Request], step: int
    ) -> Request | None:
        """Every slot taken: one request of the most served tenant to preempt when a tenant well
        behind it waits (``slot_victim``), so that slots follow the counters too."""
        if len(running) < self.config.max_num_seqs or not waiting:
            return None
        victim = slot_victim(
            self.fair,
            waiting,
            running,
            step,
            self.config.batch_max_wait_steps,
            self._cost_to_finish,
        )
        assert victim is None or isinstance(victim, Request)
        return victim

    def limits(
        self, running: Sequence[Request], waiting: Sequence[Request], step: int
    ) -> tuple[set[str] | None, int]:
        """With more than one tenant in play: the under-served tenants and the prefill budget
        left to the others this step (all of it when none is under-served); (None, budget):
        plain chunking."""
        budget = self.config.max_num_batched_tokens
        tenants = {r.tenant for r in running}
        under = underserved(self.fair, waiting, tenants, step, self.config.batch_max_wait_steps)
        if not under and len(tenants) < 2:
            return None, budget
        return under, self.config.fair_prefill_tokens if under else budget

    def growth_order(self, running: Sequence[Request]) -> list[Request]:
        """Running requests in the order they get their blocks: the least served first, so that
        a preemption can take any running request (the most served one)."""
        order = sorted(running, key=lambda r: (r.priority == "batch", r.admit_seq))
        order.sort(key=lambda r: self.fair.counter(r.tenant))
        return order

    def victim(self, candidates: Iterable[Request]) -> Request:
        pick = pick_victim(self.fair, candidates)
        assert isinstance(pick, Request)
        return pick
