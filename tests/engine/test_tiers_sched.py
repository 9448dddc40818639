"""Scheduler + host tier against the oracle runner: offloaded and restored blocks hold exactly the
K/V that was written (a read of a block whose copy has not run, a copy in the wrong order or a
reused host slot would show as a wrong read), under preemption, aborts and an oversubscribed pool.
"""

from __future__ import annotations

import random

import pytest

from engine.config import EngineConfig
from engine.core.kv import PrefixCache
from engine.core.kv.transfers import Direction, TransferPlan
from engine.core.scheduler import Scheduler
from tests.engine._sched_helpers import EOS, FakeRunner, add, make_request, solo_output


class TieredFakeRunner(FakeRunner):
    """The oracle runner with a host slot store: OUT copies a block's slots, IN writes them back."""

    def __init__(self, block_size: int) -> None:
        super().__init__(block_size)
        self.host: dict[int, list[tuple[int, int] | None]] = {}

    def transfer(self, plan: TransferPlan) -> None:
        bs = self.block_size
        for t in plan.transfers:
            slots = range(t.block_id * bs, (t.block_id + 1) * bs)
            if t.direction is Direction.OUT:
                self.host[t.slot] = [self.slots.get(s) for s in slots]
            else:
                for s, kv in zip(slots, self.host[t.slot], strict=True):
                    if kv is None:
                        self.slots.pop(s, None)
                    else:
                        self.slots[s] = kv


def make(num_blocks: int, bs: int, host_blocks: int) -> tuple[Scheduler, TieredFakeRunner]:
    cfg = EngineConfig(block_size=bs, max_num_batched_tokens=64, max_num_seqs=8)
    cache = PrefixCache(num_blocks, bs, host_blocks=host_blocks)
    sched = Scheduler(cfg, cache, max_model_len=4096, eos_token_ids=[EOS])
    return sched, TieredFakeRunner(bs)


def step(sched: Scheduler, runner: TieredFakeRunner) -> list:
    batch = sched.schedule()
    plan = sched.cache.take_transfers()
    runner.transfer(plan)  # before the forward, as EngineCore.step does
    sampled = runner.execute(batch) if not batch.is_empty else []
    sched.cache.finish_transfers(plan)
    outs = sched.update(batch, sampled)
    sched.check_integrity()
    return outs


@pytest.mark.parametrize("bs", [1, 4, 16])
def test_random_tenant_traffic_through_the_host_tier_reads_only_written_kv(bs: int) -> None:
    rng = random.Random(bs)
    sched, runner = make(num_blocks=max(24, 160 // bs), bs=bs, host_blocks=400 // bs + 8)
    systems = [[rng.randrange(1, 97) for _ in range(48)] for _ in range(6)]
    expected: dict[str, tuple[int, ...]] = {}
    finals: dict[str, object] = {}
    n = 0
    for _ in range(300):
        if n < 60 and rng.random() < 0.5:
            t = rng.randrange(len(systems))
            prompt = [*systems[t], *(rng.randrange(1, 97) for _ in range(rng.randrange(1, 6)))]
            rid = f"r{n}"
            n += 1
            add(sched, runner, make_request(rid, prompt, 4, namespace=f"t{t}"))
            expected[rid] = solo_output(prompt, 4)
        if sched.running and rng.random() < 0.05:
            victim = rng.choice(sched.running).request_id
            sched.abort(victim)
            expected.pop(victim)
        if rng.random() < 0.2:
            sched.cache.evict(rng.randrange(1, 8))  # pressure: push prompts to the host
        finals.update({o.request_id: o for o in step(sched, runner) if o.finished})
    while sched.has_unfinished():
        finals.update({o.request_id: o for o in step(sched, runner) if o.finished})
    for rid, want in expected.items():
        assert finals[rid].token_ids == want, rid  # type: ignore[attr-defined]
    stats = sched.cache.stats()
    assert stats.blocks_restored > 0 and stats.blocks_offloaded > 0
    assert stats.host_hit_tokens > 0
