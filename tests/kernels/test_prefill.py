from __future__ import annotations

import pytest
import torch

from engine.runtime.kernels.triton import extend_attention
from tests.kernels.helpers import assert_close, make_batch, ref_attention

# (context_lens, new_lens, block_size, heads, kv_heads): zero cached tokens, prefix exactly on a
# block boundary, one new token, ragged mixes; GQA ratios 1, 2, 7
CASES = [
    ((0, 5), (19, 3), 16, 2, 2),
    ((32, 7), (1, 20), 16, 4, 2),
    ((3, 0, 16), (9, 17, 2), 1, 7, 1),
    ((2, 4), (7, 18), 2, 2, 1),
    ((64, 0), (3, 33), 64, 14, 2),
]


@pytest.mark.parametrize(("ctx", "new", "block_size", "heads", "kv_heads"), CASES)
def test_extend_matches_reference_fp32(ctx, new, block_size, heads, kv_heads, device):
    batch = make_batch(
        ctx, new, block_size=block_size, num_heads=heads, num_kv_heads=kv_heads, device=device
    )
    out = extend_attention(batch.q, batch.k_cache, batch.v_cache, batch.meta, batch.scale)
    assert out.dtype == torch.float32
    assert_close(out, ref_attention(batch), torch.float32)


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16])
def test_extend_half_precision(dtype, device):
    batch = make_batch(
        (17, 0), (6, 20), block_size=16, num_heads=4, num_kv_heads=2, dtype=dtype, device=device
    )
    out = extend_attention(batch.q, batch.k_cache, batch.v_cache, batch.meta, batch.scale)
    assert out.dtype == dtype
    assert_close(out, ref_attention(batch), dtype)


def test_extend_head_dim_128(device):
    batch = make_batch(
        (16,), (18,), block_size=16, num_heads=2, num_kv_heads=1, head_dim=128, device=device
    )
    out = extend_attention(batch.q, batch.k_cache, batch.v_cache, batch.meta, batch.scale)
    assert_close(out, ref_attention(batch), torch.float32)


def test_extend_rejects_bad_shapes(device):
    batch = make_batch((4,), (4,), block_size=4, num_heads=3, num_kv_heads=2, device=device)
    with pytest.raises(ValueError, match="not a multiple"):
        extend_attention(batch.q, batch.k_cache, batch.v_cache, batch.meta, batch.scale)
    batch = make_batch((4,), (4,), block_size=4, num_heads=2, num_kv_heads=1, device=device)
    with pytest.raises(ValueError, match="dtype"):
        extend_attention(batch.q.half(), batch.k_cache, batch.v_cache, batch.meta, batch.scale)
    with pytest.raises(ValueError, match="k_cache and v_cache"):
        extend_attention(batch.q, batch.k_cache, batch.v_cache[:1], batch.meta, batch.scale)
    bad = make_batch((4,), (4,), block_size=2, num_heads=2, num_kv_heads=1, device=device)
    with pytest.raises(ValueError, match="block_size"):
        extend_attention(batch.q, batch.k_cache, batch.v_cache, bad.meta, batch.scale)
