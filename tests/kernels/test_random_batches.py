"""Seeded random ragged batches through every attention kernel (edges the fixed cases miss:
tiles ending exactly on a block or tile boundary, requests without new tokens, odd splits)."""

from __future__ import annotations

import random

import pytest
import torch

from engine.runtime.kernels.triton import cascade_attention, decode_attention, extend_attention
from tests.kernels.helpers import assert_close, make_batch, ref_attention


def _random_batch(rng: random.Random, device, *, decode: bool, shared: bool):
    block_size = rng.choice([1, 2, 4, 8, 16, 32, 64])
    kv_heads = rng.choice([1, 2])
    group = rng.choice([1, 2, 7])
    n = rng.randint(1, 4)
    ctx = [rng.choice([0, block_size, 16, rng.randint(0, 70)]) for _ in range(n)]
    new = [1] * n if decode else [rng.choice([0, 1, 16, rng.randint(1, 20)]) for _ in range(n)]
    new[0] = max(new[0], 1)
    shared_blocks = 0
    if shared:
        ctx = [c + 2 * block_size for c in ctx]
        shared_blocks = rng.randint(1, min(ctx) // block_size)
    return make_batch(
        ctx, new, block_size=block_size, num_heads=kv_heads * group, num_kv_heads=kv_heads,
        device=device, shared_blocks=shared_blocks, seed=rng.randint(0, 1 << 30),
    )  # fmt: skip


@pytest.mark.parametrize("seed", [11, 12])
def test_random_batches(seed, device):
    rng = random.Random(seed)
    for kind in ("extend", "decode", "cascade-decode", "cascade-extend"):
        batch = _random_batch(rng, device, decode="decode" in kind, shared="cascade" in kind)
        args = (batch.q, batch.k_cache, batch.v_cache, batch.meta, batch.scale)
        if kind == "extend":
            out = extend_attention(*args)
        elif kind == "decode":
            out = decode_attention(*args, num_splits=rng.randint(1, 5))
        else:
            out = cascade_attention(*args, num_splits=rng.choice([None, 1, 2, 3]))
        m = batch.meta
        case = (kind, m.block_size, m.context_lens.tolist(), m.seq_lens.tolist())
        try:
            assert_close(out, ref_attention(batch), torch.float32)
        except AssertionError as exc:
            raise AssertionError(f"{case}: {exc}") from None
