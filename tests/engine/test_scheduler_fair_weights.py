"""Weights between backlogged tenants hold for decode too, not only at admission (deterministic,
step by step, no timing).

Two ways a tenant used to keep service its counter says it should not get:

- the step budget is shorter than the running decodes: they ran oldest admission first, so the
  tenants admitted first kept every decode token whatever their counters;
- every running slot is taken: a tenant holding the slots kept decoding in all of them, and the
  others got a slot only as its requests finished (hundreds of steps for long outputs).

Each test drives three closed-loop tenants at weights 1:2:4 (a finished request is replaced at
once, so all three stay backlogged) and checks the tokens computed for each over a window.
"""

from __future__ import annotations

import itertools

import pytest

from engine.core.fairness import FairRequest, FairShare, Want, plan_step, slot_victim
from engine.core.options import GenerateOptions
from engine.core.request import Request
from engine.core.scheduler import Scheduler
from engine.params import SamplingParams
from tests.engine._sched_helpers import FakeRunner, add, make_scheduler, solo_output, step

WEIGHTS = {"w1": 1.0, "w2": 2.0, "w4": 4.0}


class ClosedLoop:
    """Tenants that put a new request in as soon as one of theirs finishes."""

    def __init__(self, sched: Scheduler, runner: FakeRunner, prompt: int, output: int) -> None:
        self.sched, self.runner = sched, runner
        self.prompt, self.output = prompt, output
        self.ids = itertools.count()
        self.expected: dict[str, tuple[int, ...]] = {}
        self.wrong: list[str] = []
        self.finished = 0

    def add(self, tenant: str, count: int = 1) -> None:
        for _ in range(count):
            i = next(self.ids)
            prompt = tuple(1 + (i * 7919 + k * 31) % 90 for k in range(self.prompt))
            sampling = SamplingParams(max_tokens=self.output, temperature=0.0, ignore_eos=True)
            weight = WEIGHTS[tenant]
            options = GenerateOptions(tenant, tenant=tenant, weight=weight)
            req = Request(f"{tenant}-{i}", prompt, sampling, options, 0.0)
            add(self.sched, self.runner, req)
            self.expected[req.request_id] = solo_output(prompt, self.output)

    def step(self) -> None:
        _, outs = step(self.sched, self.runner)
        for out in outs:
            if out.finished:
                self.finished += 1
                if out.token_ids != self.expected.pop(out.request_id):
                    self.wrong.append(out.request_id)
                self.add(out.request_id.split("-")[0])

    def served(self) -> dict[str, int]:
        return {t: self.sched.fair.tenants[t].served_tokens for t in WEIGHTS}


def assert_weighted(before: dict[str, int], after: dict[str, int]) -> None:
    got = {t: after[t] - before[t] for t in WEIGHTS}
    assert got["w1"] > 0, got
    ratio = {t: got[t] / got["w1"] for t in WEIGHTS}
    assert ratio["w2"] == pytest.approx(2.0, rel=0.1), (got, ratio)
    assert ratio["w4"] == pytest.approx(4.0, rel=0.1), (got, ratio)


def cost(req: FairRequest) -> int:
    assert isinstance(req, Request)
    return req.num_tokens + req.sampling.max_tokens - req.num_output_tokens


def counter_gap(sched: Scheduler) -> float:
    counters = [sched.fair.counter(t) for t in WEIGHTS]
    return max(counters) - min(counters)


def test_decode_tokens_follow_the_weights_when_the_budget_is_short() -> None:
    # 14 tokens a step; w1 alone first, decoding in as many requests as the budget takes, then
    # w2 and w4 arrive with backlogs. Every tenant could take the whole budget alone, so the
    # split is the scheduler's: w1's running decodes must not keep it.
    sched = make_scheduler(num_blocks=1024, max_num_batched_tokens=14, max_num_seqs=64)
    loop = ClosedLoop(sched, FakeRunner(4), prompt=4, output=60)
    loop.add("w1", 16)
    for _ in range(10):
        loop.step()
    assert sum(r.tenant == "w1" for r in sched.running) >= 14
    loop.add("w2", 16)
    loop.add("w4", 16)
    before = loop.served()
    for _ in range(200):
        loop.step()
        assert all(sched.fair.waiting_of(t) > 0 for t in WEIGHTS)  # backlogged throughout
    assert loop.finished > 0
    assert_weighted(before, loop.served())
    assert not loop.wrong


def test_a_tenant_holding_every_slot_gives_slots_up_to_later_tenants_within_the_bound() -> None:
    # w1 fills all 8 slots with long outputs; w2 and w4 arrive a step later and stay backlogged.
    # Slots are the limit (the budget is not): service follows slots held, so only moving
    # slots keeps the counters together. Bound: twice the largest request (128 tokens at
    # weight 1); left to finishing requests, w1 runs 8 x 120 tokens ahead first.
    sched = make_scheduler(num_blocks=1024, max_num_batched_tokens=256, max_num_seqs=8)
    loop = ClosedLoop(sched, FakeRunner(4), prompt=8, output=120)
    loop.add("w1", 12)
    loop.step()
    loop.add("w2", 12)
    loop.add("w4", 12)
    worst = 0.0
    for _ in range(600):
        loop.step()
        assert all(sched.fair.waiting_of(t) > 0 for t in WEIGHTS)
        worst = max(worst, counter_gap(sched))
    assert worst <= 2 * (8 + 120), f"virtual service gap {worst}"
    # Preemption is the exception: a slot changes hands only when the gap outgrows requests.
    assert 0 < sched.num_preemptions <= loop.finished
    assert not loop.wrong  # preempted requests recompute and still produce their own tokens


def test_plan_step_gives_a_short_budget_to_the_least_served_decodes_and_admissions() -> None:
    fair = FairShare()
    for tenant, weight in (("a", 1.0), ("b", 1.0)):
        fair.arrive(tenant, weight)
    fair.charge("a", 10)  # a is ahead by 10 virtual tokens
    wants = [Want(f"a{i}", "a", False, 1, False) for i in range(4)]  # a's decodes, oldest first
    wants += [Want("b0", "b", False, 1, False), Want("bw", "b", False, 3, True)]
    allow, _ = plan_step(fair, wants, budget=5, free_slots=1, under=set(), cap=5)
    # b first (its decode, then 3 tokens kept for admitting its waiting request), then a's oldest
    assert allow == {"b0": 1, "a0": 1}
    allow, _ = plan_step(fair, wants, budget=5, free_slots=0, under=set(), cap=5)
    assert allow == {"b0": 1, "a0": 1, "a1": 1, "a2": 1, "a3": 1}  # no slot: nothing kept


def test_an_under_served_admission_caps_the_others_decode_rows_in_its_step() -> None:
    """While an under-served tenant's request is admitted, the others keep only ``rows`` decode
    rows in that step (the step stays as short as the admission); without a slot for it, or
    with nobody under-served, every decode runs."""
    fair = FairShare()
    for tenant, weight in (("a", 1.0), ("b", 1.0)):
        fair.arrive(tenant, weight)
    fair.charge("a", 100)
    wants = [Want(f"a{i}", "a", False, 1, False) for i in range(6)]
    wants += [Want("b0", "b", False, 1, False), Want("bw", "b", False, 20, True)]
    allow, _ = plan_step(fair, wants, budget=64, free_slots=1, under={"b"}, cap=8, rows=2)
    assert allow == {"b0": 1, "a0": 1, "a1": 1}  # b's own decode is not capped
    allow, _ = plan_step(fair, wants, budget=64, free_slots=0, under={"b"}, cap=8, rows=2)
    assert allow == {"b0": 1, **{f"a{i}": 1 for i in range(6)}}  # b cannot be admitted
    allow, _ = plan_step(fair, wants, budget=64, free_slots=1, under=set(), cap=8, rows=2)
    assert allow == {"b0": 1, **{f"a{i}": 1 for i in range(6)}}


def test_the_scheduler_keeps_fair_decode_rows_while_an_under_served_tenant_is_admitted() -> None:
    sched = make_scheduler(
        num_blocks=256, max_num_batched_tokens=64, max_num_seqs=16, fair_decode_rows=3
    )
    runner = FakeRunner(4)

    def request(rid: str, tenant: str, prompt: tuple[int, ...]) -> Request:
        sampling = SamplingParams(max_tokens=40, temperature=0.0, ignore_eos=True)
        return Request(rid, prompt, sampling, GenerateOptions(tenant, tenant=tenant), 0.0)

    for i in range(8):
        add(sched, runner, request(f"a{i}", "a", (1, 2, i + 3)))
    for _ in range(3):
        batch, _ = step(sched, runner)  # a's requests decode, a's counter grows
    assert len(batch.seqs) == 8
    add(sched, runner, request("b0", "b", tuple(range(10, 30))))
    batch, _ = step(sched, runner)
    tenants = [s.request_id[0] for s in batch.seqs]
    assert tenants.count("b") == 1 and tenants.count("a") == 3, tenants
    batch, _ = step(sched, runner)  # b decodes: nobody waits, every decode runs again
    assert len(batch.seqs) == 9


def test_a_slot_moves_only_when_the_gap_outgrows_both_requests() -> None:
    sched = make_scheduler(num_blocks=256, max_num_batched_tokens=64, max_num_seqs=2)
    runner = FakeRunner(4)
    loop = ClosedLoop(sched, runner, prompt=4, output=40)
    loop.add("w1", 2)
    loop.step()
    loop.add("w4")  # lifted to w1's counter; its request costs 44 / 4, w1's 44
    cand = sched.waiting[0]
    victims = []
    for _ in range(60):
        gap = sched.fair.counter("w1") - sched.fair.counter("w4")
        victim = slot_victim(sched.fair, sched.waiting, sched.running, sched.num_steps, 64, cost)
        victims.append((gap, victim))
        if victim is not None:
            break
        loop.step()
    gap, victim = victims[-1]
    assert victim is not None and victim.tenant == "w1"
    assert all(v is None for g, v in victims[:-1]) and gap > 44 / 4 + 44 > victims[-2][0]
    assert sched.waiting[0] is cand
