from __future__ import annotations

import pytest
import torch

from engine.runtime.kernels.triton import cascade_attention, use_cascade
from tests.kernels.helpers import assert_close, make_batch, ref_attention

# (context_lens, new_lens, block_size, shared_blocks, heads, kv_heads, splits)
CASES = [
    ((16, 20, 35), (1, 1, 1), 16, 1, 4, 2, None),  # decode; one request exactly at the boundary
    ((16, 60), (1, 1), 16, 1, 2, 1, 2),  # decode; own keys in 2 splits: separate merge launch
    ((8, 8, 13, 9), (1, 1, 1, 1), 2, 4, 7, 1, 3),  # decode, shared prefix = whole context of two
    ((32, 40), (5, 1), 16, 2, 2, 2, 2),  # mixed: extend suffix
    ((4, 6), (9, 2), 1, 4, 14, 2, None),
    ((64, 64, 70), (2, 1, 9), 64, 1, 2, 1, None),
]


@pytest.mark.parametrize(
    ("ctx", "new", "block_size", "shared", "heads", "kv_heads", "splits"), CASES
)
def test_cascade_matches_reference_fp32(
    ctx, new, block_size, shared, heads, kv_heads, splits, device
):
    batch = make_batch(
        ctx, new, block_size=block_size, num_heads=heads, num_kv_heads=kv_heads,
        shared_blocks=shared, device=device,
    )  # fmt: skip
    out = cascade_attention(
        batch.q, batch.k_cache, batch.v_cache, batch.meta, batch.scale, num_splits=splits
    )
    assert_close(out, ref_attention(batch), torch.float32)


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16])
def test_cascade_half_precision(dtype, device):
    batch = make_batch(
        (33, 17, 20), (1, 1, 1), block_size=16, num_heads=4, num_kv_heads=2, shared_blocks=1,
        dtype=dtype, device=device,
    )  # fmt: skip
    out = cascade_attention(batch.q, batch.k_cache, batch.v_cache, batch.meta, batch.scale)
    assert out.dtype == dtype
    assert_close(out, ref_attention(batch), dtype)


def test_cascade_needs_shared_blocks(device):
    batch = make_batch((4, 4), (1, 1), block_size=4, num_heads=2, num_kv_heads=1, device=device)
    with pytest.raises(ValueError, match="num_shared_blocks"):
        cascade_attention(batch.q, batch.k_cache, batch.v_cache, batch.meta, batch.scale)


def test_use_cascade_rule():
    # the bench workload: 32 decode requests over a 2,048-token shared prompt
    assert use_cascade(128, 16, 32, 32)
    assert use_cascade(16, 16, 17, 17 * 32)  # a burst of 32-token turns over a 256-token prompt
    assert not use_cascade(0, 16, 32, 32)  # nothing shared
    assert not use_cascade(128, 16, 1, 1)  # a single request: nothing to share
    assert not use_cascade(8, 16, 32, 32)  # 128 shared tokens: too short to pay
    assert not use_cascade(16, 16, 8, 8)  # 7 x 256 = 1,792 saved token rows < 4,096
    assert use_cascade(16, 16, 17, 17)  # 16 x 256 = 4,096
    assert not use_cascade(128, 16, 4, 4 * 512)  # long prefill chunks: compute bound
