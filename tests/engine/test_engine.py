"""Engine (sync) on the real runner with a tiny random model: reuse correctness and accounting."""

from __future__ import annotations

import random

import pytest

from engine import Engine
from engine.errors import PinRejected, PromptTooLong
from engine.params import SamplingParams
from tests.engine._tiny_model import kv_bytes, tiny_model_dir

GREEDY = SamplingParams(max_tokens=6, temperature=0.0, ignore_eos=True)


def make_engine(num_blocks: int = 96, block_size: int = 4, **overrides: object) -> Engine:
    return Engine.from_pretrained(
        tiny_model_dir(),
        block_size=block_size,
        kv_cache_bytes=kv_bytes(num_blocks, block_size),
        device="cpu",
        dtype="float32",
        **overrides,
    )


def _prompts(seed: int, n: int, prefix_len: int, tail: tuple[int, int]) -> list[list[int]]:
    rng = random.Random(seed)
    prefix = [rng.randrange(3, 2000) for _ in range(prefix_len)]
    return [
        prefix + [rng.randrange(3, 2000) for _ in range(rng.randrange(*tail))] for _ in range(n)
    ]


@pytest.fixture(scope="module")
def prompts() -> list[list[int]]:
    return _prompts(5, 6, 37, (1, 12)) + _prompts(6, 2, 0, (5, 30))


@pytest.fixture(scope="module")
def reference(prompts: list[list[int]]) -> list[tuple[int, ...]]:
    """Each prompt alone, reuse off, whole prompt in one step."""
    eng = make_engine(block_size=16, enable_prefix_reuse=False)
    return [eng.generate([p], GREEDY)[0].token_ids for p in prompts]


@pytest.mark.parametrize("block_size", [1, 4, 16])
@pytest.mark.parametrize("budget", [7, 64, 8192])
def test_greedy_outputs_equal_with_reuse_on_and_off(
    prompts: list[list[int]], reference: list[tuple[int, ...]], block_size: int, budget: int
) -> None:
    for reuse in (True, False):
        eng = make_engine(
            num_blocks=512 // block_size * 4,
            block_size=block_size,
            enable_prefix_reuse=reuse,
            max_num_batched_tokens=budget,
        )
        together = eng.generate(prompts, GREEDY)  # cold cache, all in flight together
        assert [o.token_ids for o in together] == reference
        warm = eng.generate(prompts[::-1], GREEDY)  # warm cache, other composition
        assert [o.token_ids for o in warm] == reference[::-1]
        if reuse:
            assert all(o.num_cached_tokens >= 36 // block_size * block_size for o in warm[2:])
        else:
            assert all(o.num_cached_tokens == 0 for o in together + warm)
        eng.check_integrity()


def test_burst_of_eight_computes_the_shared_prefix_once_in_the_first_step() -> None:
    eng = make_engine(num_blocks=128, block_size=4)
    prompts = _prompts(9, 8, 64, (7, 8))  # 64-token shared prefix + 7 own tokens each
    ids = [eng.add_request(p, GREEDY) for p in prompts]
    eng.step()
    assert eng.num_model_tokens == 64 + 8 * 7, "prefix once, then only each request's own tokens"
    running = {r.request_id: r for r in eng.scheduler.running}
    assert all(running[rid].num_output_tokens == 1 for rid in ids), "all 8 sampled in step 1"
    outs = {}
    while eng.has_unfinished():
        outs.update({o.request_id: o for o in eng.step() if o.finished})
    assert [outs[rid].num_cached_tokens for rid in ids] == [0] + [64] * 7
    solo = make_engine(enable_prefix_reuse=False)
    assert [outs[rid].token_ids for rid in ids] == [
        o.token_ids for o in solo.generate(prompts, GREEDY)
    ]


def test_oversubscribed_pool_matches_solo_runs_and_leaks_nothing() -> None:
    # 10 requests of ~60 KV tokens (15 blocks of 4) need ~150 blocks; the pool has 36.
    prompts = _prompts(3, 5, 24, (10, 30)) + _prompts(4, 5, 0, (30, 45))
    params = SamplingParams(max_tokens=16, temperature=0.0, ignore_eos=True)
    solo = make_engine(num_blocks=64, enable_prefix_reuse=False)
    expected = [solo.generate([p], params)[0].token_ids for p in prompts]
    eng = make_engine(num_blocks=36, max_num_batched_tokens=48)
    ids = [eng.add_request(p, params) for p in prompts]
    outs = {}
    while eng.has_unfinished():
        outs.update({o.request_id: o for o in eng.step() if o.finished})
        eng.check_integrity()
    assert eng.scheduler.num_preemptions > 0
    assert [outs[rid].token_ids for rid in ids] == expected
    stats = eng.cache_stats()
    assert stats.blocks_free == stats.blocks_total == 36 and stats.blocks_in_use == 0


def test_random_aborts_return_every_block() -> None:
    rng = random.Random(17)
    eng = make_engine(num_blocks=48, max_num_batched_tokens=20)
    handle = eng.pin_prefix("t", _prompts(1, 1, 16, (0, 1))[0])
    base = eng.cache_stats()
    prompts = _prompts(2, 30, 20, (1, 20))
    live: list[str] = []
    params = SamplingParams(max_tokens=8, temperature=0.0, ignore_eos=True)
    for n in range(200):
        if n < 60 and rng.random() < 0.5:
            live.append(eng.add_request(rng.choice(prompts), params, namespace="t"))
        if live and rng.random() < 0.25:
            eng.abort(live.pop(rng.randrange(len(live))))
            eng.check_integrity()
        if eng.has_unfinished():
            done = {o.request_id for o in eng.step() if o.finished}
            live = [rid for rid in live if rid not in done]
            eng.check_integrity()
    while eng.has_unfinished():
        eng.step()
    after = eng.cache_stats()
    assert after.blocks_pinned == base.blocks_pinned == 4
    assert after.blocks_free + after.blocks_pinned == base.blocks_free + base.blocks_pinned
    eng.unpin(handle)
    assert eng.cache_stats().blocks_free == 48


def test_pin_prefix_computes_once_and_serves_hits() -> None:
    eng = make_engine(num_blocks=64)
    system = _prompts(8, 1, 22, (0, 1))[0]  # 22 tokens: 5 full blocks of 4
    handle = eng.pin_prefix("acme", system)
    assert handle.num_tokens == 20 and eng.cache_stats().blocks_pinned == 5
    computed = eng.num_model_tokens
    assert eng.pin_prefix("acme", system).num_tokens == 20  # cached now: nothing computed
    assert eng.num_model_tokens == computed
    out = eng.generate([[*system, 7, 8, 9]], GREEDY, namespace="acme")[0]
    assert out.num_cached_tokens == 20
    other = eng.generate([[*system, 7, 8, 9]], GREEDY, namespace="other")[0]
    assert other.num_cached_tokens == 0 and other.token_ids == out.token_ids
    eng.unpin(handle)
    with pytest.raises(PinRejected):
        eng.pin_prefix("acme", [5, 6, 7])  # shorter than one block
    off = make_engine(enable_prefix_reuse=False)
    with pytest.raises(PinRejected):
        off.pin_prefix("acme", system)


def test_limits_and_metadata() -> None:
    eng = make_engine(num_blocks=16)
    assert eng.max_model_len == 1024 and eng.tokenizer is not None
    with pytest.raises(PromptTooLong):
        eng.generate([[5] * 60], SamplingParams(max_tokens=8))  # 67 KV tokens > 64 in the pool
    with pytest.raises(PromptTooLong):
        eng.generate([[5] * 1020], SamplingParams(max_tokens=8))
    out = eng.generate([[5, 6, 7]], SamplingParams(max_tokens=3, temperature=0.0))[0]
    m = out.metrics
    assert m.arrival_time <= m.first_scheduled_time <= m.first_token_time <= m.finish_time
    assert out.finish_reason in ("stop", "length") and out.num_prompt_tokens == 3


def test_generate_takes_one_sampling_params_per_prompt() -> None:
    eng = make_engine()
    params = [SamplingParams(max_tokens=n, temperature=0.0, ignore_eos=True) for n in (1, 3, 5)]
    outs = eng.generate([[5, 6, 7], [5, 6, 7], [8, 9]], params)
    assert [len(o.token_ids) for o in outs] == [1, 3, 5]
    assert outs[0].token_ids == outs[1].token_ids[:1]
    with pytest.raises(ValueError):
        eng.generate([[1, 2]], params)


def test_token_ids_outside_the_vocabulary_are_refused_before_queueing() -> None:
    eng = make_engine()
    vocab = eng.core.vocab_size
    for bad in ([5, vocab], [-1, 5]):
        with pytest.raises(ValueError, match="token ids must lie in"):
            eng.add_request(bad, SamplingParams(max_tokens=2))
        with pytest.raises(ValueError, match="token ids must lie in"):
            eng.generate([[5, 6], bad], SamplingParams(max_tokens=2))
    assert not eng.has_unfinished()
    out = eng.generate([[5, vocab - 1]], SamplingParams(max_tokens=2, temperature=0.0))[0]
    assert len(out.token_ids) >= 1
