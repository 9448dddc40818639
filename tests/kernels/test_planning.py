"""Launch planning (pure functions): KV splits and GPU tile shapes."""

from __future__ import annotations

import itertools

import torch

from engine.runtime.kernels.triton import decode, prefill

CPU = torch.device("cpu")  # num_sms(cpu) = 4: the planner aims at 2 * 4 programs


def test_plan_splits_covers_the_keys_without_empty_splits():
    for work, max_kv, block_n, wanted, min_split in itertools.product(
        (1, 3, 64), (1, 15, 16, 17, 1000, 4096), (16, 64), (None, 1, 5, 1000), (0, 256)
    ):
        n, size = decode.plan_splits(work, max_kv, block_n, CPU, wanted, min_split)
        assert n >= 1 and size % block_n == 0
        assert (n - 1) * size < max_kv <= n * size  # every split starts inside the keys
        if wanted is not None:
            assert n <= wanted
        elif min_split:
            assert n <= max(1, max_kv // min_split)  # splits of at least min_split keys


def test_plan_splits_fills_the_device_then_stops():
    assert decode.plan_splits(1, 4096, 64, CPU) == (8, 512)  # 1 work item: 2 x 4 programs
    assert decode.plan_splits(8, 4096, 64, CPU) == (1, 4096)  # enough work: no split
    assert decode.plan_splits(1, 2048, 64, CPU, min_split=1024) == (2, 1024)


def test_gpu_tiles():
    # decode rows = GQA group (padded to 16); cascade's shared pass: up to 128 rows
    assert decode.gpu_tiles(64, 7).block_m == 16
    assert decode.gpu_tiles(128, 32 * 7).block_m == 128
    assert decode.gpu_tiles(128, 32 * 7).num_warps == 8
    # extend: the query tile follows the longest chunk
    assert [prefill.gpu_tiles(128, n).block_m for n in (1, 16, 17, 64, 65, 4096)] == [
        16, 16, 64, 64, 128, 128,
    ]  # fmt: skip
