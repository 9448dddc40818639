"""The fair share charges what a step costs, context included (engine/core/step_cost.py).

A tenant decoding over a long cached context used to be charged one token per decode, like a
tenant decoding over a short one, while each of its rows took the attention over thousands of
keys: with the counters level, its rows made every step longer and the other tenant's decode
rate fell (measured 40.2 -> 7.0 tok/s). Deterministic, step by step: time is the modelled cost
of the steps (SmolLM2-135M's geometry, the default model), counted from the batches the
scheduler hands the test runner.
"""

from __future__ import annotations

import itertools

import pytest

from engine.core.batch import ScheduledBatch
from engine.core.fairness import FairShare, Want, plan_step
from engine.core.options import GenerateOptions
from engine.core.request import Request
from engine.core.scheduler import Scheduler
from engine.core.step_cost import StepCost
from engine.params import SamplingParams
from tests.engine._sched_helpers import FakeRunner, add, make_scheduler, solo_output, step

# SmolLM2-135M-Instruct: hidden 576, 30 layers, 9 heads (3 KV), head dim 64, MLP 1536, vocab 49152
SMOLLM2 = StepCost.from_geometry(
    hidden=576, layers=30, heads=9, kv_heads=3, head_dim=64, intermediate=1536, vocab=49152
)
BLOCK = 16
SLOTS = 8
OUTPUT = 32


def batch_cost(batch: ScheduledBatch, cost: StepCost) -> float:
    return sum(cost.chunk(s.start_pos, len(s.token_ids), s.sample) for s in batch.seqs)


class TwoTenants:
    """A victim with short prompts and an attacker whose prompts share a ``context``-token
    prefix (cached before the run), both closed loop with more requests than slots (always
    backlogged): a finished request is replaced at once."""

    def __init__(self, context: int, cost: StepCost | None) -> None:
        self.sched: Scheduler = make_scheduler(
            num_blocks=1024,
            block_size=BLOCK,
            max_model_len=8192,
            cost=cost,
            max_num_batched_tokens=512,
            max_num_seqs=SLOTS,
        )
        self.runner = FakeRunner(BLOCK)
        self.prefix = tuple(1 + k % 89 for k in range(context))
        self.ids = itertools.count()
        self.expected: dict[str, tuple[int, ...]] = {}
        self.closed = False  # replace finished requests
        self.warm()

    def warm(self) -> None:
        """The attacker's context computed once and left in the prefix cache."""
        self.submit("a", self.prefix)
        while self.sched.has_unfinished():
            self.step()
        assert not self.sched.fair.tenants  # nobody active: the counters start level

    def submit(self, tenant: str, prompt: tuple[int, ...]) -> None:
        rid = f"{tenant}-{next(self.ids)}"
        sampling = SamplingParams(max_tokens=OUTPUT, temperature=0.0, ignore_eos=True)
        add(
            self.sched,
            self.runner,
            Request(rid, prompt, sampling, GenerateOptions(tenant, tenant=tenant), 0.0),
        )
        self.expected[rid] = solo_output(prompt, OUTPUT)

    def new(self, tenant: str) -> None:
        i = next(self.ids)
        tail = tuple(1 + (i * 7919 + k * 31) % 89 for k in range(16))
        self.submit(tenant, (*self.prefix, *tail) if tenant == "a" else (*tail, *tail))

    def step(self) -> tuple[ScheduledBatch, int]:
        """One step; the victim's tokens sampled in it."""
        batch, outs = step(self.sched, self.runner)
        got = 0
        for out in outs:
            got += len(out.new_token_ids) if out.request_id.startswith("v-") else 0
            if out.finished:
                assert out.token_ids == self.expected.pop(out.request_id)
                if self.closed:
                    self.new(out.request_id.split("-")[0])
        return batch, got

    def victim_rate(self, cost: StepCost, warmup: int = 40, steps: int = 200) -> float:
        """The victim's sampled tokens per unit of modelled time (the steps' cost)."""
        for tenant in ("v", "a"):
            for _ in range(2 * SLOTS):
                self.new(tenant)
        self.closed = True
        tokens, spent = 0, 0.0
        for n in range(warmup + steps):
            batch, got = self.step()
            if n >= warmup:
                tokens += got
                spent += batch_cost(batch, cost)
        assert all(self.sched.fair.waiting_of(t) > 0 for t in "va")  # both still backlogged
        return tokens / spent


def test_a_long_cached_context_does_not_slow_the_other_tenants_decode() -> None:
    short = TwoTenants(64, SMOLLM2).victim_rate(SMOLLM2)
    long = TwoTenants(5000, SMOLLM2).victim_rate(SMOLLM2)
    assert long / short >= 0.8, f"victim decode rate beside a 5k-context attacker: {long / short}"


def test_counting_tokens_lets_the_long_context_take_the_steps() -> None:
    """The same run with the counters charging tokens (what they did): the attacker's rows
    count as cheap as the victim's, the slots split evenly and the victim's rate falls. The
    scenario above tells the two cost models apart."""
    short = TwoTenants(64, None).victim_rate(SMOLLM2)
    long = TwoTenants(5000, None).victim_rate(SMOLLM2)
    assert long / short < 0.7


def test_every_chunk_is_charged_its_cost_with_the_context_it_reads() -> None:
    sched = make_scheduler(num_blocks=64, block_size=4, cost=SMOLLM2, max_num_batched_tokens=8)
    runner = FakeRunner(4)
    sampling = SamplingParams(max_tokens=5, temperature=0.0, ignore_eos=True)
    prefix = tuple(range(1, 25))
    options = GenerateOptions("ns", tenant="x", weight=2.0)
    first = Request("x-0", prefix, sampling, options, 0.0)
    add(sched, runner, first)
    while sched.has_unfinished():  # the prefix computed, then cached
        step(sched, runner)
    second = Request("x-1", (*prefix, 40, 41), sampling, options, 0.0)
    add(sched, runner, second)
    charged = 0.0
    while second.num_output_tokens < 4:
        batch, _ = step(sched, runner)
        charged += batch_cost(batch, SMOLLM2)
        assert sched.fair.counter("x") == pytest.approx(charged / 2.0)  # cost / weight
    assert second.num_cached_tokens == 24  # attached, not computed: not charged as tokens
    starts = [s.start_pos for b in runner.batches[-4:] for s in b.seqs]
    assert starts == [24, 26, 27, 28]  # the tail's chunk, then decodes: all read the prefix


def test_the_plan_gives_a_short_budget_by_cost_not_by_rows() -> None:
    """Four decode rows of each tenant, a budget of four tokens, level counters: a row over a
    5,000-token context advances its tenant's counter by 2.9, a short one by 1.3, so the short
    tenant gets three of the four rows (counting tokens: two each)."""
    for cost, want in ((SMOLLM2, {"a": 1, "b": 3}), (StepCost(), {"a": 2, "b": 2})):
        fair = FairShare(cost=cost)
        for t in "ab":
            fair.arrive(t, 1.0)
            fair.admitted(t)
        wants = [Want(f"a{i}", "a", False, 1, False, 5000) for i in range(4)]
        wants += [Want(f"b{i}", "b", False, 1, False, 10) for i in range(4)]
        allow, _ = plan_step(fair, wants, budget=4, free_slots=0, under=set(), cap=4)
        got = {t: sum(1 for rid in allow if rid.startswith(t)) for t in "ab"}
        assert got == want, cost


def test_step_cost_of_a_geometry() -> None:
    # SmolLM2-135M, per layer: linear 2 * (576 * 960 + 576 * 576 + 3 * 576 * 1536) = 7,077,888
    # FLOPs a token, attention 2 * 2 * 9 * 64 = 2,304 a key; LM head 2 * 576 * 49152 in all
    assert SMOLLM2.per_token == 1.0
    assert SMOLLM2.per_key == pytest.approx(2304 / 7_077_888)
    assert SMOLLM2.per_sample == pytest.approx(2 * 576 * 49152 / (30 * 7_077_888))
    # a chunk costs what its tokens cost one by one (the keys: p + 1 for each position p)
    one_by_one = sum(SMOLLM2.chunk(p, 1, False) for p in range(100, 164))
    assert SMOLLM2.chunk(100, 64, False) == pytest.approx(one_by_one)
    assert StepCost().chunk(5000, 7, True) == 7  # the default counts tokens
    assert StepCost().to_finish(12, 6) == 18
    with pytest.raises(ValueError):
        StepCost(per_token=0.0)
