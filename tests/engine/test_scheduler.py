"""Scheduler: continuous batching, chunked prefill, early reuse, stop conditions (fake runner)."""

from __future__ import annotations

import subprocess
import sys

import pytest

from engine.core.kv import CacheScope, PriorityRange
from engine.errors import PromptTooLong
from tests.engine._sched_helpers import (
    EOS,
    FakeRunner,
    add,
    make_request,
    make_scheduler,
    run_all,
    solo_output,
    step,
)


def test_scheduler_imports_no_torch() -> None:
    code = (
        "import sys, engine.core.scheduler, engine.core.request; assert 'torch' not in sys.modules"
    )
    subprocess.run([sys.executable, "-c", code], check=True)


def test_chunked_prefill_then_decode() -> None:
    sched = make_scheduler(block_size=4, max_num_batched_tokens=16)
    runner = FakeRunner(4)
    prompt = list(range(1, 41))
    add(sched, runner, make_request("a", prompt, max_tokens=5))
    chunks = []
    finals = {}
    while sched.has_unfinished():
        batch, outs = step(sched, runner)
        chunks.append([(s.start_pos, s.end_pos, s.sample) for s in batch.seqs])
        finals.update({o.request_id: o for o in outs if o.finished})
    assert chunks[:3] == [[(0, 16, False)], [(16, 32, False)], [(32, 40, True)]]
    assert chunks[3:] == [[(40, 41, True)], [(41, 42, True)], [(42, 43, True)], [(43, 44, True)]]
    out = finals["a"]
    assert out.token_ids == solo_output(prompt, 5)
    assert out.finish_reason == "length" and out.num_cached_tokens == 0
    m = out.metrics
    assert m.arrival_time <= m.first_scheduled_time <= m.first_token_time <= m.finish_time
    assert sched.cache.stats().blocks_free == 64


def test_decode_and_prefill_share_a_step() -> None:
    sched = make_scheduler(block_size=4, max_num_batched_tokens=10)
    runner = FakeRunner(4)
    add(sched, runner, make_request("a", [1, 2, 3], max_tokens=8))
    step(sched, runner)  # a: prefill, samples its first token
    add(sched, runner, make_request("b", list(range(10, 30)), max_tokens=2))
    batch, _ = step(sched, runner)
    # a decodes one token; b gets the remaining 9 tokens of budget as a prefill chunk
    assert [(s.request_id, len(s.token_ids), s.sample) for s in batch.seqs] == [
        ("a", 1, True),
        ("b", 9, False),
    ]
    finals = run_all(sched, runner)
    assert finals["b"].token_ids == solo_output(list(range(10, 30)), 2)


def test_max_num_seqs_caps_running() -> None:
    sched = make_scheduler(block_size=4, max_num_seqs=2)
    runner = FakeRunner(4)
    for i in range(5):
        add(sched, runner, make_request(f"r{i}", [i + 1] * 6, max_tokens=3))
    batch, _ = step(sched, runner)
    assert len(batch.seqs) == 2 and sched.num_running == 2 and sched.num_waiting == 3
    finals = run_all(sched, runner)
    assert all(finals[f"r{i}"].token_ids == solo_output([i + 1] * 6, 3) for i in range(5))


def test_stop_conditions() -> None:
    sched = make_scheduler(block_size=4)
    runner = FakeRunner(4, eos_at={"eos": 2, "ign": 1})
    prompt = [5, 6, 7, 8, 9]
    add(sched, runner, make_request("eos", prompt, max_tokens=10))
    add(sched, runner, make_request("ign", prompt, max_tokens=4, namespace="o", ignore_eos=True))
    stop_tok = solo_output(prompt, 3)[2]
    add(sched, runner, make_request("stop", prompt, 10, namespace="s", stop_token_ids=(stop_tok,)))
    finals = run_all(sched, runner)
    assert finals["eos"].finish_reason == "stop" and finals["eos"].token_ids[-1] == EOS
    assert len(finals["eos"].token_ids) == 3
    assert finals["ign"].finish_reason == "length" and len(finals["ign"].token_ids) == 4
    assert finals["ign"].token_ids[1] == EOS
    assert finals["stop"].finish_reason == "stop" and finals["stop"].token_ids[-1] == stop_tok
    assert len(finals["stop"].token_ids) == 3


def test_streamed_deltas_add_up() -> None:
    sched = make_scheduler(block_size=4)
    runner = FakeRunner(4)
    add(sched, runner, make_request("a", [3, 1, 4, 1, 5], max_tokens=6))
    deltas: list[int] = []
    while sched.has_unfinished():
        _, outs = step(sched, runner)
        for o in outs:
            deltas.extend(o.new_token_ids)
            assert tuple(deltas) == o.token_ids
    assert tuple(deltas) == solo_output([3, 1, 4, 1, 5], 6)


def test_burst_of_identical_prefixes_computes_it_once_in_one_step() -> None:
    bs, prefix_len, turn_len = 4, 64, 6
    sched = make_scheduler(num_blocks=256, block_size=bs, max_num_batched_tokens=512)
    runner = FakeRunner(bs)
    prefix = [(7 * i) % 90 + 1 for i in range(prefix_len)]
    prompts = [prefix + [i + 1] * turn_len for i in range(8)]
    for i, p in enumerate(prompts):
        add(sched, runner, make_request(f"r{i}", p, max_tokens=3))
    batch, _ = step(sched, runner)
    assert len(batch.seqs) == 8, "all 8 requests run in the step that computes the prefix"
    assert [s.start_pos for s in batch.seqs] == [0] + [prefix_len] * 7
    finals = run_all(sched, runner)
    first_step = prefix_len + turn_len + 7 * turn_len
    assert runner.batches[0].num_tokens == first_step
    assert runner.num_tokens == first_step + 8 * 2  # + two decode tokens each
    for i, p in enumerate(prompts):
        assert finals[f"r{i}"].token_ids == solo_output(p, 3)
        assert finals[f"r{i}"].num_cached_tokens == (0 if i == 0 else prefix_len)


def test_identical_prompts_together_share_all_but_the_last_token() -> None:
    sched = make_scheduler(num_blocks=64, block_size=4)
    runner = FakeRunner(4)
    prompt = list(range(1, 22))  # 21 tokens: 5 full blocks + 1
    for i in range(4):
        add(sched, runner, make_request(f"r{i}", prompt, max_tokens=2))
    batch, _ = step(sched, runner)
    assert [len(s.token_ids) for s in batch.seqs] == [21, 1, 1, 1]
    finals = run_all(sched, runner)
    assert all(o.token_ids == solo_output(prompt, 2) for o in finals.values())


@pytest.mark.parametrize(
    ("budget", "expected"),
    [
        # the owner's last chunk reaches token 32 with budget to spare: the dependent joins it
        (24, [[("owner", 0, 24)], [("owner", 24, 36), ("dep", 32, 34)]]),
        # the owner's chunk ends exactly at token 32 and uses the whole budget: next step
        (16, [[("owner", 0, 16)], [("owner", 16, 32)], [("owner", 32, 36), ("dep", 32, 34)]]),
    ],
)
def test_dependent_runs_once_its_chunked_owner_reaches_the_prefix(
    budget: int, expected: list[list[tuple[str, int, int]]]
) -> None:
    sched = make_scheduler(block_size=4, max_num_batched_tokens=budget)
    runner = FakeRunner(4)
    prefix = list(range(1, 33))
    add(sched, runner, make_request("owner", [*prefix, 50, 51, 52, 53], 2))
    add(sched, runner, make_request("dep", [*prefix, 60, 61], max_tokens=2))
    seen = []
    while sched.has_unfinished():
        batch, _ = step(sched, runner)
        seen.append([(s.request_id, s.start_pos, s.end_pos) for s in batch.seqs])
    assert seen[: len(expected)] == expected
    dep_tokens = sum(e - s for step_ in seen for (r, s, e) in step_ if r == "dep")
    assert dep_tokens == 2 + 1  # 2 prompt tokens + 1 decode; the prefix never recomputed


def test_late_arrival_joins_the_owners_final_chunk() -> None:
    # The dependent arrives while the owner is mid-prefill; it attaches to PENDING blocks and runs
    # in the step whose owner chunk reaches the end of the shared prefix.
    sched = make_scheduler(block_size=4, max_num_batched_tokens=20)
    runner = FakeRunner(4)
    prefix = list(range(1, 33))
    add(sched, runner, make_request("owner", [*prefix, 9], 1))
    step(sched, runner)  # owner 0..20
    add(sched, runner, make_request("dep", [*prefix, 8], 1))
    batch, _ = step(sched, runner)  # owner 20..33 reaches 32: dep joins with 1 token
    assert [(s.request_id, s.start_pos, s.end_pos) for s in batch.seqs] == [
        ("owner", 20, 33),
        ("dep", 32, 33),
    ]
    run_all(sched, runner)


def test_priorities_reach_the_cache() -> None:
    sched = make_scheduler(block_size=4)
    runner = FakeRunner(4)
    calls = []
    real_allocate = sched.cache.allocate

    def spy(rid, ns, tokens, priorities=(), scope=None):  # type: ignore[no-untyped-def]
        calls.append((tuple(priorities), scope))
        return real_allocate(rid, ns, tokens, priorities, scope=scope)

    sched.cache.allocate = spy  # type: ignore[method-assign]
    req = make_request("a", list(range(1, 13)), max_tokens=2)
    req.priorities = (PriorityRange(0, 8, 90),)
    req.cache_scope = CacheScope(b"visitor", 8)
    add(sched, runner, req)
    run_all(sched, runner)
    (prio, scope), *growth = calls
    assert prio[0] == PriorityRange(0, 8, 90)
    assert prio[1].start == 12 and prio[1].end is None and prio[1].priority < 35
    assert scope == CacheScope(b"visitor", 8)  # admission; growth keeps it (passes none)
    assert all(s is None for _, s in growth)
    prompt = [*range(1, 13), 0]
    assert sched.cache.lookup("t", prompt, CacheScope(b"visitor", 8)).num_tokens == 12
    assert sched.cache.lookup("t", prompt).num_tokens == 8  # the shared part only


def test_blocks_grown_while_decoding_keep_the_admission_priorities() -> None:
    from engine.core.scheduler import DECODE_PRIORITY

    sched = make_scheduler(block_size=4)
    runner = FakeRunner(4)
    req = make_request("a", list(range(1, 9)), max_tokens=7)
    req.priorities = (PriorityRange(0, 8, 90),)
    add(sched, runner, req)
    while req.num_tokens < 14:
        step(sched, runner)
    state = sched.cache.requests["a"]
    assert len(state.blocks) == 4  # two prompt blocks, two grown while decoding
    assert [b.priority for b in state.blocks] == [90, 90, DECODE_PRIORITY, DECODE_PRIORITY]
    run_all(sched, runner)


def test_prompt_too_long_is_refused_at_add() -> None:
    sched = make_scheduler(num_blocks=8, block_size=4, max_model_len=64)
    with pytest.raises(PromptTooLong):
        sched.add_request(make_request("a", [1] * 60, max_tokens=10))  # beyond max_model_len
    with pytest.raises(PromptTooLong):
        sched.add_request(make_request("b", [1] * 30, max_tokens=10))  # 39 KV tokens > 32
    sched.add_request(make_request("c", [1] * 30, max_tokens=3))  # 32 KV tokens fit exactly
    assert sched.num_waiting == 1


def test_request_blocked_by_pins_gets_an_error_instead_of_stalling() -> None:
    sched = make_scheduler(num_blocks=8, block_size=4)
    runner = FakeRunner(4)
    pinned = list(range(1, 17))  # 4 blocks, pinned
    add(sched, runner, make_request("p", pinned, max_tokens=1))
    run_all(sched, runner)
    assert sched.cache.pin("t", pinned)
    add(sched, runner, make_request("big", list(range(50, 70)), max_tokens=4, namespace="x"))
    add(sched, runner, make_request("ok", list(range(50, 58)), max_tokens=2, namespace="x"))
    finals = run_all(sched, runner)
    assert finals["big"].finish_reason == "abort"
    assert isinstance(finals["big"].error, PromptTooLong)
    assert finals["ok"].token_ids == solo_output(list(range(50, 58)), 2)
