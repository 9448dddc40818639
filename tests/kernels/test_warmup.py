"""Warm-up launches every kernel variant a workload needs: after it, a mixed workload (prefill
chunks, decode rows mixed in, plain decode, cascade over a shared 272-token prefix) launches no
new variant, i.e. compiles nothing on a GPU. Runs with the GPU's tiles and SM count under the
interpreter (VARIANTS models Triton's compile cache; on a GPU bench/gpu_check.sh counts real
compilations with Triton's compile hook)."""

from __future__ import annotations

import random

import pytest

from engine.params import SamplingParams
from engine.runtime.kernels.cascade_rule import use_cascade
from engine.runtime.kernels.triton import VARIANTS
from engine.runtime.model.inputs import shared_prefix_blocks
from engine.runtime.warmup import StepLimits, profile_batch, warmup_batches
from engine.serving.engine import Engine, EngineCore
from tests.kernels.engine_fixtures import route_to_triton, triton_runner


def test_no_kernel_variant_is_new_after_warm_up(monkeypatch: pytest.MonkeyPatch) -> None:
    route_to_triton(monkeypatch, gpu_tiles=True)
    runner = triton_runner(max_num_seqs=17, max_num_batched_tokens=256)
    VARIANTS.seen.clear()
    report = runner.warm_up()
    assert report.steps == len(warmup_batches(runner.limits())) and report.seconds > 0
    warm = set(VARIANTS.seen)
    kernels = {key[0] for key in warm}
    assert kernels == {
        "_rms_norm_kernel", "_rope_kernel", "_extend_kernel", "_split_kv_kernel", "_merge_kernel"
    }  # fmt: skip
    assert all(k.abs().sum() == 0 for pair in runner.kv_caches for k in pair)  # cache cleared

    rng = random.Random(7)
    prefix = [rng.randrange(3, 500) for _ in range(272)]  # 17 blocks: cascade decode
    prompts = [prefix + [rng.randrange(3, 500) for _ in range(rng.randrange(1, 30))]
               for _ in range(17)]  # fmt: skip
    prompts += [[rng.randrange(3, 500) for _ in range(n)] for n in (1, 70, 130)]
    core = EngineCore(runner, runner.config)
    Engine(core).generate(prompts, SamplingParams(max_tokens=3, temperature=0.0, ignore_eos=True))
    new = VARIANTS.seen - warm
    assert new == set(), sorted(map(str, new))


def _cascade_rows(batch, group: int) -> int | None:
    """The shared pass's row tile (16..128) when the batch uses cascade attention, else None."""
    tables = [s.block_table for s in batch.seqs]
    contexts = [s.start_pos for s in batch.seqs]
    shared = shared_prefix_blocks(tables, contexts, 16)
    if not use_cascade(shared, 16, len(batch.seqs), batch.num_tokens):
        return None
    return max(16, min(128, 1 << (batch.num_tokens * group - 1).bit_length()))


@pytest.mark.parametrize("group", [1, 2, 7])
def test_warm_up_covers_every_plan_within_the_limits(group: int) -> None:
    limits = StepLimits(16, 100_000, 32768, 8192, 256, 1000, group)
    batches = warmup_batches(limits)
    for batch in batches:
        assert batch.num_tokens <= limits.max_num_batched_tokens
        assert len(batch.seqs) <= limits.max_num_seqs
        for seq in batch.seqs:
            assert seq.end_pos <= limits.max_model_len
            assert len(seq.block_table) * 16 >= seq.end_pos
            assert all(0 <= b < limits.num_blocks for b in seq.block_table)
    # cascade: every row tile of the shared pass, decode-only and mixed with each chunk size
    cascade = [b for b in batches if _cascade_rows(b, group) is not None]
    assert {_cascade_rows(b, group) for b in cascade} == {16, 32, 64, 128}
    chunks = {max(len(s.token_ids) for s in b.seqs) for b in cascade}
    assert {1, 2, 17, 65} <= chunks
    small = StepLimits(16, 50, 128, 64, 4, 1000)  # no cascade, no 65-token chunk
    for batch in warmup_batches(small):
        assert batch.num_tokens <= 64 and len(batch.seqs) <= 4
        assert all(s.end_pos <= 128 for s in batch.seqs)
        assert _cascade_rows(batch, 1) is None


def test_profile_batch_is_the_largest_step() -> None:
    limits = StepLimits(16, 10_000, 4096, 8192, 256, 1000)
    batch = profile_batch(limits)
    assert batch.num_tokens == 8192 and len(batch.seqs) == 256
    assert all(s.sample for s in batch.seqs)
    few = profile_batch(StepLimits(16, 10_000, 100, 1000, 4, 1000))
    assert few.num_tokens == 400 and [s.end_pos for s in few.seqs] == [100] * 4
    tiny = profile_batch(StepLimits(16, 10_000, 100, 3, 4, 1000))
    assert tiny.num_tokens == 3 and len(tiny.seqs) == 3
