from __future__ import annotations

import pytest
import torch

from engine.runtime.kernels.triton import store_kv


@pytest.mark.parametrize(
    ("block_size", "dtype"), [(1, torch.float32), (16, torch.float16), (64, torch.bfloat16)]
)
def test_store_kv_writes_each_slot_and_nothing_else(block_size, dtype, device):
    gen = torch.Generator().manual_seed(1)
    num_blocks, heads, dim, tokens = max(3, 16 // block_size), 3, 64, 9
    shape = (num_blocks, block_size, heads, dim)
    k_cache = torch.randn(shape, generator=gen).to(dtype)
    v_cache = torch.randn(shape, generator=gen).to(dtype)
    key = torch.randn(tokens, heads, dim, generator=gen).to(dtype)
    value = torch.randn(tokens, heads, dim, generator=gen).to(dtype)
    slots = torch.randperm(num_blocks * block_size, generator=gen)[:tokens]
    slots[3] = -1  # padding slot: skipped
    exp_k, exp_v = k_cache.clone().view(-1, heads, dim), v_cache.clone().view(-1, heads, dim)
    keep = slots >= 0
    exp_k[slots[keep]], exp_v[slots[keep]] = key[keep], value[keep]
    kc, vc = k_cache.to(device), v_cache.to(device)
    store_kv(key.to(device), value.to(device), kc, vc, slots.to(device))
    assert torch.equal(kc.cpu().view(-1, heads, dim), exp_k)
    assert torch.equal(vc.cpu().view(-1, heads, dim), exp_v)


def test_store_kv_rejects_bad_arguments(device):
    k_cache = torch.zeros(2, 4, 2, 64, device=device)
    key = torch.zeros(3, 2, 64, device=device)
    slots = torch.arange(3, device=device)
    with pytest.raises(ValueError, match="slot_mapping must be int64"):
        store_kv(key, key, k_cache, k_cache.clone(), slots.int())
    with pytest.raises(ValueError, match="heads/head_dim"):
        store_kv(key[:, :1], key[:, :1], k_cache, k_cache.clone(), slots)
    with pytest.raises(ValueError, match="dtype"):
        store_kv(key.half(), key.half(), k_cache, k_cache.clone(), slots)
    with pytest.raises(ValueError, match="block_size must be a power of two"):
        bad = torch.zeros(2, 3, 2, 64, device=device)
        store_kv(key, key, bad, bad.clone(), slots)
