"""Production-sized shapes on a CUDA device (compiled kernels, half precision)."""

from __future__ import annotations

import pytest
import torch

from engine.runtime.kernels.triton import (
    cascade_attention,
    decode_attention,
    extend_attention,
    store_kv,
)
from tests.kernels.helpers import assert_close, make_batch, ref_attention

pytestmark = pytest.mark.gpu


@pytest.mark.parametrize(
    ("heads", "kv_heads", "head_dim", "block_size", "dtype"),
    [
        (14, 2, 64, 16, torch.bfloat16),
        (28, 4, 128, 64, torch.float16),
        (8, 8, 128, 1, torch.float16),
    ],
)
def test_extend_long_ragged(heads, kv_heads, head_dim, block_size, dtype):
    batch = make_batch(
        (0, 1000, 37, 256), (700, 300, 1, 129), block_size=block_size, num_heads=heads,
        num_kv_heads=kv_heads, head_dim=head_dim, dtype=dtype, device="cuda",
    )  # fmt: skip
    out = extend_attention(batch.q, batch.k_cache, batch.v_cache, batch.meta, batch.scale)
    assert_close(out, ref_attention(batch), dtype)


@pytest.mark.parametrize(("heads", "kv_heads", "head_dim"), [(14, 2, 64), (28, 4, 128)])
def test_decode_long_contexts(heads, kv_heads, head_dim):
    batch = make_batch(
        (9000, 1, 4095, 333, 2048), (1,) * 5, block_size=16, num_heads=heads,
        num_kv_heads=kv_heads, head_dim=head_dim, dtype=torch.bfloat16, device="cuda",
    )  # fmt: skip
    out = decode_attention(batch.q, batch.k_cache, batch.v_cache, batch.meta, batch.scale)
    assert_close(out, ref_attention(batch), torch.bfloat16)


@pytest.mark.parametrize("new", [(1,) * 32, (1, 40, 7, 1) * 8])
def test_cascade_32_requests_2048_shared(new):
    gen = torch.Generator().manual_seed(3)
    ctx = (2048 + torch.randint(0, 200, (32,), generator=gen)).tolist()
    batch = make_batch(
        ctx, new, block_size=16, num_heads=28, num_kv_heads=4, head_dim=128,
        dtype=torch.float16, device="cuda", shared_blocks=128,
    )  # fmt: skip
    out = cascade_attention(batch.q, batch.k_cache, batch.v_cache, batch.meta, batch.scale)
    assert_close(out, ref_attention(batch), torch.float16)


def test_store_kv_many_tokens():
    k_cache = torch.zeros(512, 16, 4, 128, dtype=torch.bfloat16, device="cuda")
    v_cache = torch.zeros_like(k_cache)
    slots = torch.randperm(512 * 16, device="cuda")[:3000]
    key = torch.randn(3000, 4, 128, dtype=torch.bfloat16, device="cuda")
    store_kv(key, -key, k_cache, v_cache, slots)
    assert torch.equal(k_cache.view(-1, 4, 128)[slots], key)
    assert torch.equal(v_cache.view(-1, 4, 128)[slots], -key)
