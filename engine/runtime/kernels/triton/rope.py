"""Fused rotary embedding (NeoX / HF ``rotate_half`` layout), optionally fused with the KV store.

    x' = x * cos[pos] + rotate_half(x) * sin[pos],   rotate_half([x1, x2]) = [-x2, x1]
    cos/sin: [max_position, head_dim] tables (the decoder's), rows picked by ``positions`` [T]

``rope``: q [T, Hq, D] and k [T, Hkv, D] rotated in place. ``rope_store_kv``: q rotated in place,
rotated k and v written straight into their cache slots (k itself left as is), replacing the
separate rotation, ``store_kv`` and their temporaries with one launch. One program per token; the
rotation is computed in fp32 and rounded once.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from engine.runtime.kernels.triton._common import check_device, check_kv_cache, launch, next_pow2


# A Triton kernel: untyped by design (engine/runtime/kernels/triton/_common.py)
@triton.jit  # type: ignore[untyped-decorator]  # every integer argument is fixed by the model geometry
def _rope_kernel(  # type: ignore[no-untyped-def]
    q_ptr,
    k_ptr,
    v_ptr,
    pos_ptr,
    cos_ptr,
    sin_ptr,
    k_cache_ptr,
    v_cache_ptr,
    slot_ptr,
    num_q_heads,
    num_kv_heads,
    stride_qt,
    stride_qh,
    stride_kt,
    stride_kh,
    stride_vt,
    stride_vh,
    stride_cos,
    stride_sin,
    stride_cb,
    stride_cs,
    stride_ch,
    HALF: tl.constexpr,
    BLOCK_HQ: tl.constexpr,
    BLOCK_HK: tl.constexpr,
    BLOCK_SIZE: tl.constexpr,
    STORE: tl.constexpr,
):
    t = tl.program_id(0).to(tl.int64)
    pos = tl.load(pos_ptr + t).to(tl.int64)
    d = tl.arange(0, HALF)
    cos1 = tl.load(cos_ptr + pos * stride_cos + d).to(tl.float32)[None, :]
    cos2 = tl.load(cos_ptr + pos * stride_cos + HALF + d).to(tl.float32)[None, :]
    sin1 = tl.load(sin_ptr + pos * stride_sin + d).to(tl.float32)[None, :]
    sin2 = tl.load(sin_ptr + pos * stride_sin + HALF + d).to(tl.float32)[None, :]
    hq = tl.arange(0, BLOCK_HQ)[:, None]
    q_row = q_ptr + t * stride_qt + hq * stride_qh + d[None, :]
    q_ok = hq < num_q_heads
    q1 = tl.load(q_row, mask=q_ok, other=0.0).to(tl.float32)
    q2 = tl.load(q_row + HALF, mask=q_ok, other=0.0).to(tl.float32)
    tl.store(q_row, (q1 * cos1 - q2 * sin1).to(q_ptr.dtype.element_ty), mask=q_ok)
    tl.store(q_row + HALF, (q2 * cos2 + q1 * sin2).to(q_ptr.dtype.element_ty), mask=q_ok)
    hk = tl.arange(0, BLOCK_HK)[:, None]
    k_row = k_ptr + t * stride_kt + hk * stride_kh + d[None, :]
    k_ok = hk < num_kv_heads
    k1 = tl.load(k_row, mask=k_ok, other=0.0).to(tl.float32)
    k2 = tl.load(k_row + HALF, mask=k_ok, other=0.0).to(tl.float32)
    k1_out = (k1 * cos1 - k2 * sin1).to(k_ptr.dtype.element_ty)
    k2_out = (k2 * cos2 + k1 * sin2).to(k_ptr.dtype.element_ty)
    if STORE:
        slot = tl.load(slot_ptr + t)
        if slot >= 0:  # slot < 0: padding token, nothing stored
            cache_off = (slot // BLOCK_SIZE) * stride_cb + (slot % BLOCK_SIZE) * stride_cs
            cache_off = cache_off + hk * stride_ch + d[None, :]
            tl.store(k_cache_ptr + cache_off, k1_out, mask=k_ok)
            tl.store(k_cache_ptr + cache_off + HALF, k2_out, mask=k_ok)
            v_row = v_ptr + t * stride_vt + hk * stride_vh + d[None, :]
            tl.store(v_cache_ptr + cache_off, tl.load(v_row, mask=k_ok), mask=k_ok)
            tl.store(v_cache_ptr + cache_off + HALF, tl.load(v_row + HALF, mask=k_ok), mask=k_ok)
    else:
        tl.store(k_row, k1_out, mask=k_ok)
        tl.store(k_row + HALF, k2_out, mask=k_ok)


def supports(head_dim: int) -> bool:
    """Head dims the kernel tiles: powers of two from 16."""
    return head_dim >= 16 and head_dim & (head_dim - 1) == 0


def _check(
    q: torch.Tensor, k: torch.Tensor, positions: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor
) -> None:
    if q.dim() != 3 or k.dim() != 3 or q.shape[0] != k.shape[0] or q.shape[2] != k.shape[2]:
        raise ValueError(f"q/k must be [T, H, D] with equal T and D: {q.shape}, {k.shape}")
    head_dim = q.shape[2]
    if not supports(head_dim) or q.stride(2) != 1 or k.stride(2) != 1:
        raise ValueError(f"head_dim must be a power of two >= 16 and contiguous, got {head_dim}")
    if q.dtype != k.dtype or cos.dtype != sin.dtype:
        raise ValueError(f"q/k dtypes {q.dtype}/{k.dtype}, cos/sin {cos.dtype}/{sin.dtype}")
    if cos.dim() != 2 or cos.shape != sin.shape or cos.shape[1] != head_dim or cos.stride(1) != 1:
        raise ValueError(f"cos/sin must be contiguous [max_position, {head_dim}] tables")
    if sin.stride(1) != 1:
        raise ValueError("sin needs a contiguous last dimension")
    if positions.dim() != 1 or positions.shape[0] != q.shape[0] or positions.is_floating_point():
        raise ValueError(f"positions must be integer [{q.shape[0]}], got {positions.shape}")
    check_device(q, k, positions, cos, sin)


def _launch(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor | None,
    positions: torch.Tensor,
    cos: torch.Tensor,
    sin: torch.Tensor,
    k_cache: torch.Tensor | None,
    v_cache: torch.Tensor | None,
    slots: torch.Tensor | None,
) -> None:
    store = k_cache is not None
    cache = k_cache if store else cos  # unused pointers without a store
    cache_strides = k_cache.stride()[:3] if k_cache is not None else (0, 0, 0)
    v = v if store and v is not None else k
    args = (
        q,
        k,
        v,
        positions,
        cos,
        sin,
        cache,
        v_cache if store else cos,
        slots if store else positions,
        q.shape[1],
        k.shape[1],
        q.stride(0),
        q.stride(1),
        k.stride(0),
        k.stride(1),
        v.stride(0),
        v.stride(1),
        cos.stride(0),
        sin.stride(0),
        *cache_strides,
    )
    launch(
        _rope_kernel,
        (q.shape[0],),
        args,
        HALF=q.shape[2] // 2,
        BLOCK_HQ=next_pow2(q.shape[1]),
        BLOCK_HK=next_pow2(k.shape[1]),
        BLOCK_SIZE=k_cache.shape[1] if k_cache is not None else 1,
        STORE=store,
        num_warps=4,
        num_stages=1,
    )


def rope(
    q: torch.Tensor, k: torch.Tensor, positions: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor
) -> None:
    """Rotate q [T, Hq, D] and k [T, Hkv, D] in place by ``cos/sin[positions]``."""
    _check(q, k, positions, cos, sin)
    if q.shape[0]:
        _launch(q, k, None, positions, cos, sin, None, None, None)


def rope_store_kv(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    positions: torch.Tensor,
    cos: torch.Tensor,
    sin: torch.Tensor,
    k_cache: torch.Tensor,
    v_cache: torch.Tensor,
    slot_mapping: torch.Tensor,
) -> None:
    """Rotate q in place; write rotated k and v [T, Hkv, D] into the caches at ``slot_mapping``."""
    _check(q, k, positions, cos, sin)
    check_kv_cache(k_cache, v_cache)
    if v.shape != k.shape or v.dtype != k.dtype or v.stride(2) != 1:
        raise ValueError(f"v must match k: {tuple(v.shape)} {v.dtype} vs {tuple(k.shape)}")
    if tuple(k.shape[1:]) != tuple(k_cache.shape[2:]) or k.dtype != k_cache.dtype:
        raise ValueError("k heads/head_dim/dtype differ from the cache's")
    if slot_mapping.dtype != torch.int64 or slot_mapping.shape != (k.shape[0],):
        raise ValueError(f"slot_mapping must be int64 [{k.shape[0]}]")
    check_device(q, v, k_cache, v_cache, slot_mapping)
    if q.shape[0]:
        _launch(q, k, v, positions, cos, sin, k_cache, v_cache, slot_mapping)
