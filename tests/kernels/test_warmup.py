"""Warm-up launches every kernel variant a workload needs: after it, a mixed workload (prefill
chunks, decode rows mixed in, plain decode, cascade over a shared 272-token prefix) launches no
new variant, i.e. compiles nothing on a GPU. Runs with the GPU's tiles and SM count under the
interpreter (VARIANTS models Triton's compile cache; on a GPU bench/gpu_check.sh counts real
compilations with Triton's compile hook)."""

from __future__ import annotations

import random

import pytest

from engine.engine import Engine, EngineCore
from engine.kernels.triton import VARIANTS
from engine.params import SamplingParams
from engine.warmup import StepLimits, profile_batch, warmup_batches
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


def test_warm_up_covers_every_plan_within_the_limits() -> None:
    limits = StepLimits(16, 1000, 4096, 8192, 256, 1000)
    batches = warmup_batches(limits)
    sizes = sorted({len(b.seqs) for b in batches})
    assert sizes[0] == 1 and 17 in sizes and 256 in sizes  # cascade batch sizes up to the cap
    for batch in batches:
        assert batch.num_tokens <= limits.max_num_batched_tokens
        assert len(batch.seqs) <= limits.max_num_seqs
        for seq in batch.seqs:
            assert seq.end_pos <= limits.max_model_len
            assert len(seq.block_table) * 16 >= seq.end_pos
            assert all(0 <= b < limits.num_blocks for b in seq.block_table)
    small = StepLimits(16, 50, 128, 64, 4, 1000)  # no cascade, no 100-token chunk
    for batch in warmup_batches(small):
        assert batch.num_tokens <= 64 and len(batch.seqs) <= 4
        assert all(s.end_pos <= 128 for s in batch.seqs)


def test_profile_batch_is_the_largest_step() -> None:
    limits = StepLimits(16, 10_000, 4096, 8192, 256, 1000)
    batch = profile_batch(limits)
    assert batch.num_tokens == 8192 and len(batch.seqs) == 256
    assert all(s.sample for s in batch.seqs)
    few = profile_batch(StepLimits(16, 10_000, 100, 1000, 4, 1000))
    assert few.num_tokens == 1000 and all(s.end_pos < 100 for s in few.seqs)
