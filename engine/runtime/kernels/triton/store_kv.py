"""Write the new tokens' K and V into their paged slots.

    key/value    [T, Hkv, D]                    (one row per new token of the batch)
    slot_mapping [T] int64, slot = block_id * block_size + offset; slots < 0 are skipped (padding)
    k_cache      [num_blocks, block_size, Hkv, D] (v_cache alike)

One program per token copies all of its heads for K and V.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from engine.runtime.kernels.triton._common import check_device, check_kv_cache, launch, next_pow2


# A Triton kernel: untyped by design (engine/runtime/kernels/triton/_common.py)
@triton.jit  # type: ignore[untyped-decorator]  # every integer argument is fixed by the model geometry
def _store_kv_kernel(  # type: ignore[no-untyped-def]
    key_ptr,
    value_ptr,
    k_cache_ptr,
    v_cache_ptr,
    slot_ptr,
    num_heads,
    stride_kt,
    stride_kh,
    stride_vt,
    stride_vh,
    stride_kcb,
    stride_kcs,
    stride_kch,
    stride_vcb,
    stride_vcs,
    stride_vch,
    BLOCK_SIZE: tl.constexpr,
    HEAD_DIM: tl.constexpr,
    BLOCK_H: tl.constexpr,
):
    t = tl.program_id(0)
    slot = tl.load(slot_ptr + t)
    if slot < 0:
        return
    block = slot // BLOCK_SIZE
    offset = slot % BLOCK_SIZE
    h = tl.arange(0, BLOCK_H)
    d = tl.arange(0, HEAD_DIM)
    mask = (h < num_heads)[:, None]
    src_k = key_ptr + t.to(tl.int64) * stride_kt + h[:, None] * stride_kh + d[None, :]
    src_v = value_ptr + t.to(tl.int64) * stride_vt + h[:, None] * stride_vh + d[None, :]
    dst_k = k_cache_ptr + block * stride_kcb + offset * stride_kcs
    dst_v = v_cache_ptr + block * stride_vcb + offset * stride_vcs
    dst_k = dst_k + h[:, None] * stride_kch + d[None, :]
    dst_v = dst_v + h[:, None] * stride_vch + d[None, :]
    tl.store(dst_k, tl.load(src_k, mask=mask), mask=mask)
    tl.store(dst_v, tl.load(src_v, mask=mask), mask=mask)


def _check(
    key: torch.Tensor, value: torch.Tensor, k_cache: torch.Tensor, slot: torch.Tensor
) -> None:
    if key.dim() != 3 or key.shape != value.shape:
        raise ValueError(
            "key and value must both be [num_tokens, num_kv_heads, head_dim], "
            f"got {tuple(key.shape)} and {tuple(value.shape)}"
        )
    if tuple(key.shape[1:]) != tuple(k_cache.shape[2:]):
        raise ValueError(
            f"key heads/head_dim {tuple(key.shape[1:])} differ from the cache's "
            f"{tuple(k_cache.shape[2:])}"
        )
    if key.dtype != k_cache.dtype or value.dtype != k_cache.dtype:
        raise ValueError(f"key/value dtype {key.dtype}/{value.dtype} != cache {k_cache.dtype}")
    if key.stride(2) != 1 or value.stride(2) != 1:
        raise ValueError("key and value need a contiguous last (head_dim) dimension")
    if slot.dtype != torch.int64 or slot.dim() != 1 or slot.shape[0] != key.shape[0]:
        raise ValueError(
            f"slot_mapping must be int64 [{key.shape[0]}], got {slot.dtype} {slot.shape}"
        )


def store_kv(
    key: torch.Tensor,
    value: torch.Tensor,
    k_cache: torch.Tensor,
    v_cache: torch.Tensor,
    slot_mapping: torch.Tensor,
) -> None:
    """Scatter ``key``/``value`` rows into the caches at ``slot_mapping`` (in place)."""
    check_kv_cache(k_cache, v_cache)
    _check(key, value, k_cache, slot_mapping)
    check_device(key, value, k_cache, v_cache, slot_mapping)
    num_tokens, num_heads, head_dim = key.shape
    if num_tokens == 0:
        return
    args = (
        key, value, k_cache, v_cache, slot_mapping, num_heads, key.stride(0), key.stride(1),
        value.stride(0), value.stride(1), *k_cache.stride()[:3], *v_cache.stride()[:3],
    )  # fmt: skip
    launch(
        _store_kv_kernel,
        (num_tokens,),
        args,
        BLOCK_SIZE=k_cache.shape[1],
        HEAD_DIM=head_dim,
        BLOCK_H=next_pow2(num_heads),
        num_warps=4,
        num_stages=1,
    )
