from __future__ import annotations

import torch

from engine.runtime.kernels.triton import choose_kernel, paged_attention, store_kv
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


def test_triton_path_matches_the_engine_reference_ops(device):
    """The CPU path of the dispatch point and the Triton kernels read the same contract."""
    from engine.runtime.kernels import reference

    batch = make_batch(
        (0, 7, 16), (5, 1, 3), block_size=8, num_heads=4, num_kv_heads=2, device=device
    )
    ref = reference.paged_attention(
        batch.q.cpu(), batch.k_cache.cpu(), batch.v_cache.cpu(), _cpu(batch.meta), batch.scale
    )
    out = paged_attention(batch.q, batch.k_cache, batch.v_cache, batch.meta, batch.scale)
    assert_close(out, ref.double(), torch.float32)
    key = torch.randn(9, 2, 64, device=device)
    slots = torch.randperm(batch.k_cache.shape[0] * 8, device=device)[:9]
    expected_k, expected_v = batch.k_cache.cpu().clone(), batch.v_cache.cpu().clone()
    reference.store_kv(key.cpu(), -key.cpu(), expected_k, expected_v, slots.cpu())
    store_kv(key, -key, batch.k_cache, batch.v_cache, slots)
    assert torch.equal(batch.k_cache.cpu(), expected_k)
    assert torch.equal(batch.v_cache.cpu(), expected_v)


def _cpu(meta):
    fields = {f: getattr(meta, f) for f in meta.__dataclass_fields__}
    return type(meta)(**{k: v.cpu() if torch.is_tensor(v) else v for k, v in fields.items()})


def test_dispatch_point_routes_cuda_tensors_to_these_kernels():
    import engine.runtime.kernels
    import engine.runtime.kernels.triton as triton_ops

    assert engine.runtime.kernels._triton() is triton_ops
    assert engine.runtime.kernels._on_triton(torch.empty(1, device="meta")) is False
    for name in ("store_kv", "paged_attention", "rms_norm", "rope_store_kv"):
        assert callable(getattr(triton_ops, name))
