"""Stateful property test of the scheduler with tenants, weights and priority classes.

Random arrivals of three tenants (shared prefixes: early reuse; a small pool: preemption;
a small budget: chunked prefill; few slots and long outputs: slots moved to a tenant far
behind), steps and aborts under both policies. After every step the
scheduler's and the cache's integrity checks hold, including the fair-share state (per-tenant
active / waiting counts, no counter kept when nobody is active); at the end every request that
was not aborted produced exactly the tokens it would produce alone.
"""

from __future__ import annotations

import itertools

from hypothesis import HealthCheck, settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, initialize, invariant, rule

from engine.core.options import GenerateOptions
from engine.core.request import Request
from engine.core.scheduler import Scheduler
from engine.params import SamplingParams
from tests.engine._sched_helpers import FakeRunner, add, make_scheduler, solo_output, step

BASES = ((5, 6, 7, 8, 9, 10, 11, 12), (21, 22, 23, 24, 25, 26))


class FairSchedulerMachine(RuleBasedStateMachine):
    sched: Scheduler
    runner: FakeRunner

    @initialize(policy=st.sampled_from(["fair", "fcfs"]), cap=st.integers(1, 8))
    def setup(self, policy: str, cap: int) -> None:
        self.sched = make_scheduler(
            num_blocks=14,
            block_size=4,
            max_num_batched_tokens=12,
            max_num_seqs=4,
            scheduling=policy,
            fair_prefill_tokens=cap,
            batch_max_wait_steps=3,
        )
        self.runner = FakeRunner(4)
        self.ids = itertools.count()
        self.expected: dict[str, tuple[int, ...]] = {}
        self.aborted: set[str] = set()
        self.done: dict[str, tuple[int, ...]] = {}

    @rule(
        tenant=st.sampled_from("abc"),
        weight=st.sampled_from([1.0, 2.0, 4.0]),
        batch=st.booleans(),
        base=st.sampled_from(BASES),
        tail=st.lists(st.integers(1, 90), max_size=5),
        # long outputs too: a tenant holding every slot for long is what moves a slot
        max_tokens=st.one_of(st.integers(1, 6), st.integers(16, 28)),
    )
    def arrive(
        self,
        tenant: str,
        weight: float,
        batch: bool,
        base: tuple[int, ...],
        tail: list[int],
        max_tokens: int,
    ) -> None:
        rid = f"{tenant}{next(self.ids)}"
        prompt = (*base, *tail)
        sampling = SamplingParams(max_tokens=max_tokens, temperature=0.0, ignore_eos=True)
        priority = "batch" if batch else "interactive"
        options = GenerateOptions("ns", tenant=tenant, weight=weight, priority=priority)
        req = Request(rid, prompt, sampling, options, 0.0)
        add(self.sched, self.runner, req)
        self.expected[rid] = solo_output(prompt, max_tokens)

    @rule(n=st.integers(1, 4))
    def run(self, n: int) -> None:
        for _ in range(n):
            if self.sched.has_unfinished():
                self._step()

    @rule(data=st.data())
    def abort(self, data: st.DataObject) -> None:
        live = sorted(self.sched.requests)
        if live:
            rid = data.draw(st.sampled_from(live))
            self.sched.abort(rid)
            self.aborted.add(rid)
            self.sched.check_integrity()

    def _step(self) -> None:
        batch, outs = step(self.sched, self.runner)  # checks integrity
        assert not batch.is_empty or any(o.finished for o in outs), "idle step with work left"
        for o in outs:
            if o.finished:
                self.done[o.request_id] = tuple(o.token_ids)

    @invariant()
    def counters_follow_the_requests(self) -> None:
        fair = self.sched.fair
        active = {r.tenant for r in self.sched.requests.values()}
        assert active <= set(fair.tenants)
        assert len(fair.tenants) <= 3  # inactive tenants are dropped once nobody is active
        for state in fair.tenants.values():
            assert state.waiting <= state.active and state.counter >= 0

    def teardown(self) -> None:
        for _ in range(2000):
            if not self.sched.has_unfinished():
                break
            self._step()
        assert not self.sched.has_unfinished(), "requests did not finish"
        assert not self.sched.fair.tenants
        assert set(self.expected) - self.aborted <= set(self.done), "a request was lost"
        for rid, tokens in self.done.items():
            if rid not in self.aborted:
                assert tokens == self.expected[rid], rid


FairSchedulerMachine.TestCase.settings = settings(
    max_examples=60,
    stateful_step_count=40,
    derandomize=True,
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow],
)
test_fair_scheduler_state_machine = FairSchedulerMachine.TestCase
