"""Extend (prefill with a cached prefix) attention over the paged KV cache.

Request b owns query rows ``query_start_loc[b] : query_start_loc[b+1]`` at absolute positions
``context_lens[b] + i``; row i attends to keys ``kv_lo .. context_lens[b] + i`` (cached prefix
unmasked, new tokens causal). The new tokens' K/V are already in the cache, so every key is read
through the block table. One program per (query tile, request, query head)::

    keys:  kv_lo ........ ctx + m*BLOCK_M | ......... min(seq_len, ctx + (m+1)*BLOCK_M)
           visible to every row of tile m | causal mask applied (tiles crossing this line)

Online softmax in base 2 (scores pre-multiplied by scale*log2 e). With ``lse`` given, the kernel
writes a normalized fp32 partial and its log-sum-exp instead (the suffix half of cascade attention).
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from engine.runtime.kernels.metadata import AttentionMetadata
from engine.runtime.kernels.triton._common import (
    INTERPRETER_TILES,
    Tiles,
    check_attention,
    dot_options,
    interpreting,
    launch,
)
from engine.runtime.kernels.triton.decode import decode_rows
from engine.runtime.kernels.triton.tile_ops import load_kv_tile, online_softmax_update

LOG2E = 1.4426950408889634
# values that change from step to step; strides are fixed by the geometry and stay specialized
_EXTEND_RUNTIME_INTS = ["kv_lo", "stride_bt"]
# cascade passes lse = part_lse[first], whose 16-byte alignment depends on the token count; its
# accesses are scalar per row, so alignment is not worth a variant
_EXTEND_ANY_ALIGNMENT = ["lse_ptr"]


# A Triton kernel: untyped by design (engine/runtime/kernels/triton/_common.py)
@triton.jit(  # type: ignore[untyped-decorator]
    do_not_specialize=_EXTEND_RUNTIME_INTS, do_not_specialize_on_alignment=_EXTEND_ANY_ALIGNMENT
)
def _extend_kernel(  # type: ignore[no-untyped-def]
    q_ptr,
    k_ptr,
    v_ptr,
    out_ptr,
    lse_ptr,
    bt_ptr,
    qsl_ptr,
    ctx_ptr,
    seq_ptr,
    scale_log2,
    kv_lo,
    num_heads,
    stride_qt,
    stride_qh,
    stride_ot,
    stride_oh,
    stride_kb,
    stride_ks,
    stride_kh,
    stride_vb,
    stride_vs,
    stride_vh,
    stride_bt,
    GROUP: tl.constexpr,
    HEAD_DIM: tl.constexpr,
    BLOCK_M: tl.constexpr,
    BLOCK_N: tl.constexpr,
    BLOCK_SIZE: tl.constexpr,
    WRITE_LSE: tl.constexpr,
    PRECISION: tl.constexpr,
    UPCAST: tl.constexpr,
    SKIP_SINGLE: tl.constexpr,
):
    tile = tl.num_programs(0) - 1 - tl.program_id(0)  # longest (most keys) tiles start first
    b = tl.program_id(1)
    head = tl.program_id(2)
    q_first = tl.load(qsl_ptr + b)
    q_len = tl.load(qsl_ptr + b + 1) - q_first
    if tile * BLOCK_M >= q_len:
        return
    if SKIP_SINGLE:  # noqa: SIM102 (constexpr) one-token requests: the split-KV kernel's
        if q_len == 1:
            return
    ctx = tl.load(ctx_ptr + b)
    row = tile * BLOCK_M + tl.arange(0, BLOCK_M)
    row_ok = row < q_len
    q_pos = ctx + row
    tok = (q_first + row).to(tl.int64)
    kv_head = head // GROUP
    d = tl.arange(0, HEAD_DIM)
    q = tl.load(
        q_ptr + tok[:, None] * stride_qt + head * stride_qh + d[None, :],
        mask=row_ok[:, None],
        other=0.0,
    )
    if UPCAST:
        q = q.to(tl.float32)
    causal_from = ctx + tile * BLOCK_M  # keys below: visible to every row of the tile
    hi = tl.minimum(tl.load(seq_ptr + b), causal_from + BLOCK_M)
    m_i = tl.full([BLOCK_M], float("-inf"), tl.float32)
    l_i = tl.full([BLOCK_M], 0.0, tl.float32)
    acc = tl.full([BLOCK_M, HEAD_DIM], 0.0, tl.float32)
    bt_row = bt_ptr + b.to(tl.int64) * stride_bt
    for start in range(kv_lo, hi, BLOCK_N):
        pos = start + tl.arange(0, BLOCK_N)
        pos_ok = pos < hi
        k, v = load_kv_tile(
            k_ptr, v_ptr, bt_row, pos, pos_ok, kv_head, d, stride_kb, stride_ks, stride_kh,
            stride_vb, stride_vs, stride_vh, BLOCK_SIZE, UPCAST,
        )  # fmt: skip
        s = tl.dot(q, tl.trans(k), input_precision=PRECISION) * scale_log2
        if start + BLOCK_N > causal_from:
            s = tl.where(pos[None, :] <= q_pos[:, None], s, float("-inf"))
        # every row keeps a finite max: the first tile holds key kv_lo <= q_pos of each row
        m_i, l_i, acc = online_softmax_update(s, v, m_i, l_i, acc, PRECISION)
    out = acc / l_i[:, None]
    dst = out_ptr + tok[:, None] * stride_ot + head * stride_oh + d[None, :]
    if WRITE_LSE:
        tl.store(dst, out, mask=row_ok[:, None])
        tl.store(lse_ptr + tok * num_heads + head, m_i + tl.log2(l_i), mask=row_ok)
    else:
        tl.store(dst, out.to(out_ptr.dtype.element_ty), mask=row_ok[:, None])


def gpu_tiles(head_dim: int, max_query_len: int) -> Tiles:
    """Tiles of the extend kernel on a GPU. Long chunks: 128 query rows x 64 keys, 8 warps (two
    warpgroups of 64 rows), 3 stages. Short chunks (decode rows and short turns in a mixed batch)
    get 64- or 16-row tiles, so a tile is not mostly padding re-reading the whole prefix. All
    compile without register spills on sm_90 for head dims 64 and 128 in fp16/bf16 (fp32 is a
    correctness path on GPUs: exact products, not tuned)."""
    if max_query_len <= 16:
        return Tiles(16, 64, 4, 3)
    if max_query_len <= 64:
        return Tiles(64, 64 if head_dim <= 64 else 32, 4, 3)
    return Tiles(128, 64, 8, 3)


def tile_config(head_dim: int, max_query_len: int) -> Tiles:
    return INTERPRETER_TILES if interpreting() else gpu_tiles(head_dim, max_query_len)


def extend_partials(
    q: torch.Tensor,
    k_cache: torch.Tensor,
    v_cache: torch.Tensor,
    meta: AttentionMetadata,
    scale: float,
    *,
    out: torch.Tensor,
    lse: torch.Tensor | None = None,
    kv_lo: int = 0,
    skip_single: bool = False,
) -> None:
    """Launch the extend kernel (no checks; callers validate). ``kv_lo`` must be <= every
    ``context_lens[b]``. ``lse`` given: ``out`` is fp32 [T, Hq, D] and gets normalized partials.
    ``skip_single``: requests with one new token are left to the caller."""
    _, num_heads, head_dim = q.shape
    block_m, block_n, num_warps, num_stages = tile_config(head_dim, meta.max_query_len)
    precision, upcast = dot_options(q.dtype)
    grid = (triton.cdiv(meta.max_query_len, block_m), meta.num_seqs, num_heads)
    args = (
        q, k_cache, v_cache, out, lse if lse is not None else out, meta.block_tables,
        meta.query_start_loc, meta.context_lens, meta.seq_lens, scale * LOG2E, kv_lo, num_heads,
        q.stride(0), q.stride(1), out.stride(0), out.stride(1), *k_cache.stride()[:3],
        *v_cache.stride()[:3], meta.block_tables.stride(0),
    )  # fmt: skip
    launch(
        _extend_kernel,
        grid,
        args,
        GROUP=num_heads // k_cache.shape[2],
        HEAD_DIM=head_dim,
        BLOCK_M=block_m,
        BLOCK_N=block_n,
        BLOCK_SIZE=k_cache.shape[1],
        WRITE_LSE=lse is not None,
        PRECISION=precision,
        UPCAST=upcast,
        SKIP_SINGLE=skip_single,
        num_warps=num_warps,
        num_stages=num_stages,
    )


def extend_attention(
    q: torch.Tensor,
    k_cache: torch.Tensor,
    v_cache: torch.Tensor,
    meta: AttentionMetadata,
    scale: float,
) -> torch.Tensor:
    """Ragged extend attention for a mixed batch; returns out [T, Hq, D] in q's dtype. The
    one-token requests listed in ``meta.decode_seqs`` go to the split-KV kernel instead."""
    check_attention(q, k_cache, v_cache, meta)
    out = torch.empty_like(q)
    if q.shape[0] == 0 or meta.max_query_len == 0:
        return out
    mixed = meta.decode_seqs is not None and meta.decode_seqs.shape[0] > 0
    extend_partials(q, k_cache, v_cache, meta, scale, out=out, skip_single=mixed)
    if mixed:
        decode_rows(q, k_cache, v_cache, meta, scale, out)
    return out
