"""Decode attention: flash-decoding over the paged KV cache, then a log-sum-exp merge.

Split-KV: the KV range of a *segment* (a set of query rows that all see the same keys, unmasked)
is cut into ``num_splits`` chunks of ``split_size`` tokens; each program attends one tile of rows to
one chunk and writes a normalized partial output plus its log-sum-exp::

    grid = (segments, row tiles, kv_heads * num_splits)
    rows of a segment = (query token, head of the GQA group) flattened, so one program reads each
    K/V tile once for all the query heads that share it
    part_o   [P, T, Hq, D] fp32   partial p of row (t, h); empty chunk: 0
    part_lse [P, T, Hq]    fp32   base-2 log-sum-exp of the scaled scores; empty chunk: -inf

Decode: one segment per request (its single query token, keys [0, seq_len)). Cascade attention
reuses the same kernel in SINGLE_SEGMENT mode: one segment holding every query token of the batch,
keys [0, kv_hi) through block_tables[0], described by scalars (no index tensors to build).
``merge_partials`` combines the P partials of each row: o = sum_p 2^(lse_p - m) o_p / sum_p 2^(...).
When one split suffices (many requests x KV heads already fill the device), the kernel writes the
output directly (DIRECT) and there is no merge launch.
"""

from __future__ import annotations

from typing import NamedTuple

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
    next_pow2,
    num_sms,
)
from engine.runtime.kernels.triton.tile_ops import (
    load_kv_tile,
    merge_partial,
    online_softmax_update,
)

LOG2E = 1.4426950408889634
MERGE_BLOCK_P = 16  # partials merged per loop iteration (one merge variant for any split count)
# values that change from step to step (strides are fixed by the model geometry and stay
# specialized: their 16-divisibility is what lets the K/V loads vectorize)
_SPLIT_KV_RUNTIME_INTS = [
    "num_shared_parts", "kv_lo", "kv_hi", "split_size", "num_splits", "part_base", "num_tokens",
    "stride_bt",
]  # fmt: skip


# A Triton kernel: untyped by design (engine/runtime/kernels/triton/_common.py)
@triton.jit(do_not_specialize=_SPLIT_KV_RUNTIME_INTS)  # type: ignore[untyped-decorator]
def _split_kv_kernel(  # type: ignore[no-untyped-def]
    q_ptr,
    k_ptr,
    v_ptr,
    bt_ptr,
    seg_q_ptr,
    seg_kv_ptr,
    seg_idx_ptr,
    part_o_ptr,
    part_lse_ptr,
    shared_o_ptr,
    shared_lse_ptr,
    num_shared_parts,
    scale_log2,
    kv_lo,
    kv_hi,
    split_size,
    num_splits,
    part_base,
    num_tokens,
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
    PRECISION: tl.constexpr,
    UPCAST: tl.constexpr,
    SINGLE_SEGMENT: tl.constexpr,
    INDEXED: tl.constexpr,
    DIRECT: tl.constexpr,
    MERGE_SHARED: tl.constexpr,
):
    seg = tl.program_id(0)
    tile = tl.program_id(1)
    kv_head = tl.program_id(2) // num_splits
    split = tl.program_id(2) % num_splits
    b = seg  # the request (block table row) of this segment
    if SINGLE_SEGMENT:
        q_first = 0
        num_rows = num_tokens * GROUP
        seg_hi = kv_hi
    else:
        if INDEXED:
            b = tl.load(seg_idx_ptr + seg)
        q_first = tl.load(seg_q_ptr + b)
        num_rows = (tl.load(seg_q_ptr + b + 1) - q_first) * GROUP
        seg_hi = tl.load(seg_kv_ptr + b)
    if tile * BLOCK_M >= num_rows:
        return
    row = tile * BLOCK_M + tl.arange(0, BLOCK_M)
    row_ok = row < num_rows
    tok = q_first + row // GROUP
    head = kv_head * GROUP + row % GROUP
    d = tl.arange(0, HEAD_DIM)
    q = tl.load(
        q_ptr + tok[:, None].to(tl.int64) * stride_qt + head[:, None] * stride_qh + d[None, :],
        mask=row_ok[:, None],
        other=0.0,
    )
    if UPCAST:
        q = q.to(tl.float32)
    lo = kv_lo + split * split_size
    hi = tl.minimum(seg_hi, lo + split_size)
    m_i = tl.full([BLOCK_M], float("-inf"), tl.float32)
    l_i = tl.full([BLOCK_M], 0.0, tl.float32)
    acc = tl.full([BLOCK_M, HEAD_DIM], 0.0, tl.float32)
    bt_row = bt_ptr + b.to(tl.int64) * stride_bt
    for start in range(lo, hi, BLOCK_N):
        pos = start + tl.arange(0, BLOCK_N)
        pos_ok = pos < hi
        k, v = load_kv_tile(
            k_ptr, v_ptr, bt_row, pos, pos_ok, kv_head, d, stride_kb, stride_ks, stride_kh,
            stride_vb, stride_vs, stride_vh, BLOCK_SIZE, UPCAST,
        )  # fmt: skip
        s = tl.dot(q, tl.trans(k), input_precision=PRECISION) * scale_log2
        s = tl.where(pos_ok[None, :], s, float("-inf"))
        m_i, l_i, acc = online_softmax_update(s, v, m_i, l_i, acc, PRECISION)
    if MERGE_SHARED:  # fold in cascade's shared-prefix partials (same rows, same units)
        for part in range(0, num_shared_parts):
            p_row = (part * num_tokens + tok).to(tl.int64) * num_heads + head
            lse_p = tl.load(shared_lse_ptr + p_row, mask=row_ok, other=float("-inf"))
            o_p = tl.load(
                shared_o_ptr + p_row[:, None] * HEAD_DIM + d[None, :],
                mask=row_ok[:, None],
                other=0.0,
            )
            m_i, l_i, acc = merge_partial(m_i, l_i, acc, lse_p, o_p)
    nonempty = l_i > 0.0
    out = acc / tl.where(nonempty, l_i, 1.0)[:, None]
    if DIRECT:  # the only split: part_o_ptr is the output [T, Hq, D] itself
        row_off = tok[:, None].to(tl.int64) * stride_ot + head[:, None] * stride_oh
        out_ptrs = part_o_ptr + row_off + d[None, :]
        tl.store(out_ptrs, out.to(part_o_ptr.dtype.element_ty), mask=row_ok[:, None])
    else:
        lse = tl.where(nonempty, m_i + tl.log2(tl.where(nonempty, l_i, 1.0)), float("-inf"))
        part_row = ((part_base + split) * num_tokens + tok).to(tl.int64) * num_heads + head
        part_ptrs = part_o_ptr + part_row[:, None] * HEAD_DIM + d[None, :]
        tl.store(part_ptrs, out, mask=row_ok[:, None])
        tl.store(part_lse_ptr + part_row, lse, mask=row_ok)


# A Triton kernel: untyped by design (engine/runtime/kernels/triton/_common.py)
@triton.jit(do_not_specialize=["num_parts", "num_tokens"])  # type: ignore[untyped-decorator]
def _merge_kernel(  # type: ignore[no-untyped-def]
    part_o_ptr,
    part_lse_ptr,
    out_ptr,
    num_parts,
    num_tokens,
    num_heads,
    stride_ot,
    stride_oh,
    HEAD_DIM: tl.constexpr,
    BLOCK_P: tl.constexpr,
):
    t = tl.program_id(0)
    h = tl.program_id(1)
    d = tl.arange(0, HEAD_DIM)
    m_vec = tl.full([BLOCK_P], float("-inf"), tl.float32)
    for p0 in range(0, num_parts, BLOCK_P):
        p = p0 + tl.arange(0, BLOCK_P)
        part_row = (p * num_tokens + t).to(tl.int64) * num_heads + h
        lse = tl.load(part_lse_ptr + part_row, mask=p < num_parts, other=float("-inf"))
        m_vec = tl.maximum(m_vec, lse)
    m = tl.max(m_vec, 0)
    m = tl.where(m == float("-inf"), 0.0, m)  # every partial empty: all weights 0, output 0
    total = tl.full([BLOCK_P], 0.0, tl.float32)
    acc = tl.full([BLOCK_P, HEAD_DIM], 0.0, tl.float32)
    for p0 in range(0, num_parts, BLOCK_P):
        p = p0 + tl.arange(0, BLOCK_P)
        p_ok = p < num_parts
        part_row = (p * num_tokens + t).to(tl.int64) * num_heads + h
        w = tl.exp2(tl.load(part_lse_ptr + part_row, mask=p_ok, other=float("-inf")) - m)
        o = tl.load(
            part_o_ptr + part_row[:, None] * HEAD_DIM + d[None, :], mask=p_ok[:, None], other=0.0
        )
        total += w
        acc += o * w[:, None]
    total_sum = tl.sum(total, 0)
    merged = tl.sum(acc, 0) / tl.where(total_sum > 0.0, total_sum, 1.0)
    dst = out_ptr + t.to(tl.int64) * stride_ot + h * stride_oh + d
    tl.store(dst, merged.to(out_ptr.dtype.element_ty))


def gpu_tiles(head_dim: int, rows: int) -> Tiles:
    """Tiles of the split-KV kernel on a GPU for segments of up to ``rows`` (query token x group
    head) rows: each row tile re-reads the segment's K/V, so the tile grows with the rows (up to
    128, the shared pass of cascade attention) while decode (rows = group) keeps small tiles."""
    block_m = max(16, min(128, next_pow2(rows)))
    block_n = 64 if head_dim <= 64 else 32
    return Tiles(block_m, block_n, 8 if block_m * head_dim >= 128 * 128 else 4, 3)


def tile_config(head_dim: int, rows: int) -> Tiles:
    return INTERPRETER_TILES if interpreting() else gpu_tiles(head_dim, rows)


def plan_splits(
    work_items: int,
    max_kv: int,
    block_n: int,
    device: torch.device,
    wanted: int | None = None,
    min_split: int = 0,
) -> tuple[int, int]:
    """(num_splits, split_size): enough KV splits that the grid fills the device about twice
    over, each at least ``min_split`` keys (when not ``wanted`` explicitly); ``split_size`` is a
    multiple of ``block_n`` and no split starts past ``max_kv``."""
    max_kv = max(max_kv, 1)
    if wanted is None:
        wanted = triton.cdiv(2 * num_sms(device), max(1, work_items))
        wanted = min(wanted, max(1, max_kv // max(min_split, 1)))
    wanted = max(1, min(wanted, triton.cdiv(max_kv, block_n), 256))
    split_size = triton.cdiv(triton.cdiv(max_kv, wanted), block_n) * block_n
    return triton.cdiv(max_kv, split_size), split_size


class Segments(NamedTuple):
    """Query rows and key ranges of one split-KV launch.

    ``seg_q``/``seg_kv`` given: segment i = query tokens ``seg_q[i]:seg_q[i+1]``, keys
    ``kv_lo .. seg_kv[i]-1`` through ``block_tables[i]`` (``max_rows`` tokens at most); with
    ``seg_idx`` too, segment i is request ``seg_idx[i]`` instead of request i.
    Both None: a single segment of every query token, keys ``kv_lo .. kv_hi-1`` through
    ``block_tables[0]``.
    """

    block_tables: torch.Tensor
    seg_q: torch.Tensor | None
    seg_kv: torch.Tensor | None
    kv_lo: int
    kv_hi: int  # single segment: key end; else an upper bound of every seg_kv[i]
    max_rows: int
    seg_idx: torch.Tensor | None = None


def split_kv_partials(
    q: torch.Tensor,
    k_cache: torch.Tensor,
    v_cache: torch.Tensor,
    segs: Segments,
    *,
    splits: tuple[int, int],
    part_o: torch.Tensor,
    part_lse: torch.Tensor,
    part_base: int,
    scale: float,
    out: torch.Tensor | None = None,
    merge_with: tuple[torch.Tensor, torch.Tensor] | None = None,
) -> None:
    """Partials ``part_base .. part_base + num_splits - 1`` of every row of every segment;
    ``splits`` = (num_splits, split_size) from ``plan_splits``. With ``out`` (one split only)
    the normalized result goes straight to out [T, Hq, D] and no partials are written; with
    ``merge_with`` = (part_o, part_lse) of earlier partials too, they are merged in first."""
    num_tokens, num_heads, head_dim = q.shape
    num_kv_heads, block_size = k_cache.shape[2], k_cache.shape[1]
    group = num_heads // num_kv_heads
    block_m, block_n, num_warps, num_stages = tile_config(head_dim, segs.max_rows * group)
    num_splits, split_size = splits
    precision, upcast = dot_options(q.dtype)
    single = segs.seg_q is None
    indexed = segs.seg_idx is not None
    listed = segs.seg_idx if indexed else segs.seg_kv  # one entry per segment
    if single:
        num_segs = 1
    else:
        assert listed is not None, "segments with seg_q need seg_kv"
        num_segs = listed.shape[0]
    grid = (num_segs, triton.cdiv(segs.max_rows * group, block_m), num_kv_heads * num_splits)
    seg_q = segs.block_tables if single else segs.seg_q  # unused pointer in single mode
    seg_kv = segs.block_tables if single else segs.seg_kv
    seg_idx = segs.seg_idx if indexed else segs.block_tables  # unused pointer unless indexed
    if out is not None and num_splits != 1:
        raise ValueError("a direct output needs exactly one split")
    if merge_with is not None and out is None:
        raise ValueError("merging earlier partials needs a direct output")
    dst = out if out is not None else part_o
    shared_o, shared_lse = merge_with if merge_with is not None else (part_o, part_lse)
    num_shared = shared_o.shape[0] if merge_with is not None else 0
    args = (
        q, k_cache, v_cache, segs.block_tables, seg_q, seg_kv, seg_idx, dst, part_lse, shared_o,
        shared_lse, num_shared, scale * LOG2E, segs.kv_lo, segs.kv_hi, split_size, num_splits,
        part_base, num_tokens, num_heads, q.stride(0), q.stride(1), dst.stride(0), dst.stride(1),
        *k_cache.stride()[:3], *v_cache.stride()[:3], segs.block_tables.stride(0),
    )  # fmt: skip
    launch(
        _split_kv_kernel,
        grid,
        args,
        GROUP=group,
        HEAD_DIM=head_dim,
        BLOCK_M=block_m,
        BLOCK_N=block_n,
        BLOCK_SIZE=block_size,
        PRECISION=precision,
        UPCAST=upcast,
        SINGLE_SEGMENT=single,
        INDEXED=indexed,
        DIRECT=out is not None,
        MERGE_SHARED=merge_with is not None,
        num_warps=num_warps,
        num_stages=num_stages,
    )


def merge_partials(part_o: torch.Tensor, part_lse: torch.Tensor, out: torch.Tensor) -> None:
    """out[t, h] = log-sum-exp weighted mean of the partials ``part_o[:, t, h]``."""
    num_parts, num_tokens, num_heads, head_dim = part_o.shape
    args = (part_o, part_lse, out, num_parts, num_tokens, num_heads, out.stride(0), out.stride(1))
    launch(
        _merge_kernel,
        (num_tokens, num_heads),
        args,
        HEAD_DIM=head_dim,
        BLOCK_P=MERGE_BLOCK_P,
        num_warps=1 if head_dim <= 64 else 2,
        num_stages=1,
    )


def new_partials(num_parts: int, q: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    t, h, d = q.shape
    part_o = torch.empty((num_parts, t, h, d), dtype=torch.float32, device=q.device)
    return part_o, torch.empty((num_parts, t, h), dtype=torch.float32, device=q.device)


def decode_attention(
    q: torch.Tensor,
    k_cache: torch.Tensor,
    v_cache: torch.Tensor,
    meta: AttentionMetadata,
    scale: float,
    *,
    num_splits: int | None = None,
) -> torch.Tensor:
    """One query token per request over its whole block table; returns out [B, Hq, D].

    Requires ``meta.is_decode_only`` and ``q.shape[0] == meta.num_seqs``.
    """
    check_attention(q, k_cache, v_cache, meta)
    group = q.shape[1] // k_cache.shape[2]
    if not meta.is_decode_only or q.shape[0] != meta.num_seqs:
        raise ValueError(
            f"decode needs exactly one query token per request: {q.shape[0]} tokens, "
            f"{meta.num_seqs} requests, max_query_len {meta.max_query_len}"
        )
    out = torch.empty_like(q)
    if q.shape[0] == 0:
        return out
    segs = Segments(
        meta.block_tables, meta.query_start_loc, meta.seq_lens, 0, meta.max_seq_len, max_rows=1
    )
    splits = plan_splits(
        meta.num_seqs * k_cache.shape[2],
        meta.max_seq_len,
        tile_config(q.shape[2], group)[1],
        q.device,
        num_splits,
    )
    if splits[0] == 1:  # enough requests x kv heads to fill the device: no merge needed
        split_kv_partials(
            q, k_cache, v_cache, segs, splits=splits, part_o=out, part_lse=out, part_base=0,
            scale=scale, out=out,
        )  # fmt: skip
        return out
    part_o, part_lse = new_partials(splits[0], q)
    split_kv_partials(
        q, k_cache, v_cache, segs, splits=splits, part_o=part_o, part_lse=part_lse, part_base=0,
        scale=scale,
    )  # fmt: skip
    merge_partials(part_o, part_lse, out)
    return out


def decode_rows(
    q: torch.Tensor,
    k_cache: torch.Tensor,
    v_cache: torch.Tensor,
    meta: AttentionMetadata,
    scale: float,
    out: torch.Tensor,
) -> None:
    """Attention of the one-token requests ``meta.decode_seqs`` of a mixed batch into their rows
    of ``out``: one split-KV program per (request, KV head) covering its GQA group, one split (the
    batch's prefill chunks already occupy the device), output written directly."""
    assert meta.decode_seqs is not None
    if meta.decode_seqs.shape[0] == 0:
        return
    segs = Segments(
        meta.block_tables, meta.query_start_loc, meta.seq_lens, 0, meta.max_seq_len, max_rows=1,
        seg_idx=meta.decode_seqs,
    )  # fmt: skip
    block_n = tile_config(q.shape[2], q.shape[1] // k_cache.shape[2])[1]
    splits = plan_splits(1, meta.max_seq_len, block_n, q.device, wanted=1)
    split_kv_partials(
        q, k_cache, v_cache, segs, splits=splits, part_o=out, part_lse=out, part_base=0,
        scale=scale, out=out,
    )  # fmt: skip
