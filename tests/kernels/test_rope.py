from __future__ import annotations

import pytest
import torch

from engine.runtime.kernels.triton.rope import rope, rope_store_kv
from tests.kernels.helpers import TOLERANCE


def _tables(max_pos: int, head_dim: int, dtype: torch.dtype) -> tuple[torch.Tensor, ...]:
    """The decoder's cos/sin tables (float32 math, then cast)."""
    inv_freq = 1.0 / (10000.0 ** (torch.arange(0, head_dim, 2, dtype=torch.float32) / head_dim))
    freqs = torch.outer(torch.arange(max_pos, dtype=torch.float32), inv_freq)
    emb = torch.cat((freqs, freqs), dim=-1)
    return emb.cos().to(dtype), emb.sin().to(dtype)


def _rotate(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    """float64 reference: x * cos + rotate_half(x) * sin."""
    x, cos, sin = x.double(), cos.double()[:, None], sin.double()[:, None]
    half = x.shape[-1] // 2
    return x * cos + torch.cat((-x[..., half:], x[..., :half]), dim=-1) * sin


def _inputs(dtype: torch.dtype, head_dim: int = 64):
    gen = torch.Generator().manual_seed(9)
    qkv = torch.randn(6, (4 + 2 + 2) * head_dim, generator=gen).to(dtype)
    sizes = [4 * head_dim, 2 * head_dim, 2 * head_dim]
    q, k, v = (t.view(6, -1, head_dim) for t in qkv.split(sizes, -1))
    positions = torch.tensor([0, 5, 17, 3, 99, 63])
    return qkv, q, k, v, positions, *_tables(128, head_dim, dtype)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_rope_in_place_on_strided_views(dtype, device):
    # q and k are views into one fused qkv projection output, as in the decoder
    qkv, q, k, _, positions, cos, sin = _inputs(dtype)
    want_q = _rotate(q, cos[positions], sin[positions])
    want_k = _rotate(k, cos[positions], sin[positions])
    qkv = qkv.to(device)
    dq, dk, _ = (t.view(6, -1, 64) for t in qkv.split([256, 128, 128], -1))
    rope(dq, dk, positions.to(device), cos.to(device), sin.to(device))
    atol, rtol = TOLERANCE[dtype]
    torch.testing.assert_close(dq.cpu().double(), want_q, atol=atol, rtol=rtol)
    torch.testing.assert_close(dk.cpu().double(), want_k, atol=atol, rtol=rtol)


def test_rope_store_kv_writes_rotated_keys_and_values(device):
    qkv, q, k, v, positions, cos, sin = _inputs(torch.float32)
    k_cache = torch.zeros(4, 4, 2, 64)
    v_cache = torch.zeros(4, 4, 2, 64)
    slots = torch.tensor([3, 0, 15, -1, 8, 9])
    want_q = _rotate(q, cos[positions], sin[positions])
    want_k = _rotate(k, cos[positions], sin[positions])
    k_before = k.clone()
    dev = [t.to(device) for t in (qkv, positions, cos, sin, k_cache, v_cache, slots)]
    dqkv, dpos, dcos, dsin, dkc, dvc, dslots = dev
    dq, dk, dv = (t.view(6, -1, 64) for t in dqkv.split([256, 128, 128], -1))
    rope_store_kv(dq, dk, dv, dpos, dcos, dsin, dkc, dvc, dslots)
    torch.testing.assert_close(dq.cpu().double(), want_q, atol=2e-5, rtol=1e-4)
    assert torch.equal(dk.cpu(), k_before)  # k itself is not written
    flat_k, flat_v = dkc.cpu().view(-1, 2, 64), dvc.cpu().view(-1, 2, 64)
    keep = slots >= 0
    torch.testing.assert_close(flat_k[slots[keep]].double(), want_k[keep], atol=2e-5, rtol=1e-4)
    assert torch.equal(flat_v[slots[keep]], v[keep])
    untouched = torch.ones(16, dtype=torch.bool)
    untouched[slots[keep]] = False
    assert not flat_k[untouched].any() and not flat_v[untouched].any()


def test_rope_rejects_bad_tables(device):
    q = torch.zeros(2, 2, 64, device=device)
    cos = torch.zeros(8, 32, device=device)
    with pytest.raises(ValueError, match="cos/sin"):
        rope(q, q.clone(), torch.zeros(2, dtype=torch.long, device=device), cos, cos)
