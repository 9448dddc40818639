"""Scheduler under pressure: preemption, aborts, handoffs of PENDING blocks (fake runner)."""

from __future__ import annotations

import random

import pytest

from tests.engine._sched_helpers import (
    FakeRunner,
    add,
    make_request,
    make_scheduler,
    run_all,
    solo_output,
    step,
)


def _baseline_free(sched) -> int:  # type: ignore[no-untyped-def]
    stats = sched.cache.stats()
    return stats.blocks_free + stats.blocks_pinned


@pytest.mark.parametrize("reuse", [True, False])
def test_oversubscribed_pool_completes_everything(reuse: bool) -> None:
    # 12 requests of up to 48 KV tokens (12 blocks of 4) on a 36-block pool: 4x oversubscribed.
    num_blocks, bs = 36, 4
    sched = make_scheduler(num_blocks, bs, enable_reuse=reuse, max_num_batched_tokens=64)
    runner = FakeRunner(bs)
    rng = random.Random(3)
    shared = [rng.randrange(1, 90) for _ in range(16)]
    prompts = {}
    for i in range(12):
        tail = [rng.randrange(1, 90) for _ in range(rng.randrange(4, 20))]
        prompts[f"r{i}"] = (shared if i % 2 else []) + tail
        add(sched, runner, make_request(f"r{i}", prompts[f"r{i}"], max_tokens=12))
    finals = run_all(sched, runner)
    assert sched.num_preemptions > 0, "the workload must actually preempt"
    for rid, prompt in prompts.items():
        assert finals[rid].token_ids == solo_output(prompt, 12), rid
        assert finals[rid].finish_reason == "length"
    stats = sched.cache.stats()
    assert stats.blocks_in_use == 0 and stats.blocks_pending == 0
    assert stats.blocks_free == num_blocks


def test_preempted_request_is_requeued_first_and_recomputes() -> None:
    sched = make_scheduler(num_blocks=8, block_size=4, max_num_batched_tokens=64)
    runner = FakeRunner(4)
    add(sched, runner, make_request("old", list(range(1, 13)), max_tokens=12))  # 3 blocks
    add(sched, runner, make_request("new", list(range(20, 32)), max_tokens=12, namespace="n"))
    while sched.num_preemptions == 0:
        step(sched, runner)
    assert sched.waiting[0].request_id == "new" and sched.waiting[0].num_preemptions == 1
    assert [r.request_id for r in sched.running] == ["old"]
    finals = run_all(sched, runner)
    assert finals["new"].token_ids == solo_output(list(range(20, 32)), 12)
    assert finals["new"].metrics.num_preemptions >= 1


def test_abort_frees_blocks_immediately() -> None:
    sched = make_scheduler(num_blocks=16, block_size=4)
    runner = FakeRunner(4)
    base = _baseline_free(sched)
    add(sched, runner, make_request("a", list(range(1, 20)), max_tokens=8))
    step(sched, runner)
    assert _baseline_free(sched) < base
    out = sched.abort("a")
    assert out is not None and out.finished and out.finish_reason == "abort"
    sched.check_integrity()
    assert sched.cache.stats().blocks_in_use == 0
    assert sched.abort("a") is None and not sched.has_unfinished()


def test_owner_aborted_before_computing_hands_blocks_to_dependent() -> None:
    # The scheduler admits a request only with budget left after its owners' chunks, so between
    # steps nobody is attached to blocks still PENDING. An owner leaving before computing them
    # is still handled: build that state by admitting the dependent by hand while the owner
    # (budget 8, 25-token prompt) has computed only tokens 0..8.
    sched = make_scheduler(num_blocks=32, block_size=4, max_num_batched_tokens=8)
    runner = FakeRunner(4)
    prefix = list(range(1, 25))
    add(sched, runner, make_request("owner", [*prefix, 30], max_tokens=2))
    step(sched, runner)
    add(sched, runner, make_request("dep", [*prefix, 40], max_tokens=2))
    dep = sched.waiting[0]
    alloc = sched.cache.allocate("dep", "t", dep.all_token_ids)
    assert alloc is not None
    sched._admit(dep, alloc)
    sched.check_integrity()
    assert dep.num_computed == 24 and sched.cache.pending_deps("dep") == {"owner": 24}
    sched.abort("owner")
    sched.check_integrity()
    assert dep.num_computed == 8 and dep.num_cached_tokens == 8
    finals = run_all(sched, runner)
    assert finals["dep"].token_ids == solo_output([*prefix, 40], 2)
    assert finals["dep"].num_cached_tokens == 8


def test_random_aborts_keep_integrity_and_return_blocks() -> None:
    rng = random.Random(11)
    num_blocks, bs = 48, 4
    sched = make_scheduler(num_blocks, bs, max_num_batched_tokens=12)
    runner = FakeRunner(bs)
    base = _baseline_free(sched)
    prefixes = [[rng.randrange(1, 90) for _ in range(rng.choice([8, 16, 20]))] for _ in range(3)]
    expected: dict[str, list[int]] = {}
    finals = {}
    kinds_seen = set()
    for n in range(400):
        if n < 120 and rng.random() < 0.4:
            rid = f"r{n}"
            prompt = rng.choice(prefixes) + [
                rng.randrange(1, 90) for _ in range(rng.randrange(1, 17))
            ]
            expected[rid] = prompt
            add(sched, runner, make_request(rid, prompt, max_tokens=rng.randrange(1, 10)))
        if sched.requests and rng.random() < 0.15:
            victim = rng.choice(list(sched.requests.values()))
            if victim.status.value == "running":
                kinds_seen.add("prefill" if victim.num_output_tokens == 0 else "decode")
            else:
                kinds_seen.add("waiting")
            out = sched.abort(victim.request_id)
            assert out is not None and out.finish_reason == "abort"
            finals[victim.request_id] = out
            sched.check_integrity()
        if sched.has_unfinished():
            _, outs = step(sched, runner)
            finals.update({o.request_id: o for o in outs if o.finished})
    finals.update(run_all(sched, runner))
    assert {"prefill", "decode", "waiting"} <= kinds_seen
    for rid, out in finals.items():
        if out.finish_reason == "length":
            max_tokens = len(out.token_ids)
            assert out.token_ids == solo_output(expected[rid], max_tokens)
    assert _baseline_free(sched) == base
    stats = sched.cache.stats()
    assert stats.blocks_in_use == 0 and stats.blocks_pending == 0
