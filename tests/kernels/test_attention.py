from __future__ import annotations

import torch

from engine.kernels.triton import choose_kernel, paged_attention
from tests.kernels.helpers import assert_close, make_batch, ref_attention


def _meta(ctx, new, block_size=16, shared=0):
    return make_batch(
        ctx, new, block_size=block_size, num_heads=1, num_kv_heads=1, head_dim=16,
        shared_blocks=shared,
    ).meta  # fmt: skip


def test_choose_kernel():
    assert choose_kernel(_meta((5, 9), (1, 1)), 2) == "decode"
    assert choose_kernel(_meta((5, 9), (1, 4)), 5) == "extend"
    assert choose_kernel(_meta((0,), (1,)), 1) == "decode"  # a one-token prompt
    # 17 decode requests over a 256-token shared prompt: cascade pays
    many = _meta((256,) * 17, (1,) * 17, shared=16)
    assert choose_kernel(many, 17) == "cascade"
    # the same prefix shared by only 4 requests: per-request decode
    few = _meta((256,) * 4, (1,) * 4, shared=16)
    assert choose_kernel(few, 4) == "decode"


def test_paged_attention_runs_the_chosen_kernel(device):
    for new in ((1, 1, 1), (3, 1, 6)):
        batch = make_batch(
            (9, 0, 20), new, block_size=4, num_heads=4, num_kv_heads=2, device=device
        )
        out = paged_attention(batch.q, batch.k_cache, batch.v_cache, batch.meta, batch.scale)
        assert_close(out, ref_attention(batch), torch.float32)
