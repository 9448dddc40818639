from __future__ import annotations

import pytest
import torch

from engine.runtime.kernels.triton import decode_attention
from tests.kernels.helpers import assert_close, make_batch, ref_attention

# (context_lens, block_size, heads, kv_heads, num_splits): one new token per request; splits
# beyond the number of KV tiles leave empty chunks that the merge must ignore
CASES = [
    ((0, 31, 16), 16, 2, 2, 1),  # a single split writes the output directly
    ((47, 5, 64), 2, 4, 2, 3),
    ((20, 9), 1, 7, 1, 2),
    ((63, 1), 64, 14, 2, 8),
]


@pytest.mark.parametrize(("ctx", "block_size", "heads", "kv_heads", "splits"), CASES)
def test_decode_matches_reference_fp32(ctx, block_size, heads, kv_heads, splits, device):
    batch = make_batch(
        ctx, [1] * len(ctx), block_size=block_size, num_heads=heads, num_kv_heads=kv_heads,
        device=device,
    )  # fmt: skip
    out = decode_attention(
        batch.q, batch.k_cache, batch.v_cache, batch.meta, batch.scale, num_splits=splits
    )
    assert_close(out, ref_attention(batch), torch.float32)


@pytest.mark.parametrize(("dtype", "head_dim"), [(torch.float16, 64), (torch.bfloat16, 128)])
def test_decode_half_precision(dtype, head_dim, device):
    batch = make_batch(
        (40, 3), (1, 1), block_size=16, num_heads=4, num_kv_heads=2, head_dim=head_dim,
        dtype=dtype, device=device,
    )  # fmt: skip
    out = decode_attention(batch.q, batch.k_cache, batch.v_cache, batch.meta, batch.scale)
    assert out.dtype == dtype
    assert_close(out, ref_attention(batch), dtype)


def test_decode_rejects_prefill_batches(device):
    batch = make_batch((4, 0), (1, 2), block_size=4, num_heads=2, num_kv_heads=1, device=device)
    with pytest.raises(ValueError, match="one query token per request"):
        decode_attention(batch.q, batch.k_cache, batch.v_cache, batch.meta, batch.scale)
