"""``@triton.jit`` helpers shared by the attention kernels (inlined into each caller).

Online softmax in base 2 over K/V tiles read through a block table::

    per tile of keys pos[BLOCK_N]:  s = (q . k) * scale * log2(e), masked to -inf
        m' = max(m, rowmax(s));  l = l 2^(m - m') + rowsum(2^(s - m'));  acc = acc 2^(m - m') + p v

A row's first tile must hold at least one visible key (every caller guarantees it), so m stays
finite after the first update and no 2^(-inf - -inf) appears.
"""

from __future__ import annotations

import triton
import triton.language as tl


# A Triton kernel: untyped by design (engine/runtime/kernels/triton/_common.py)
@triton.jit  # type: ignore[untyped-decorator]
def load_kv_tile(  # type: ignore[no-untyped-def]
    k_ptr,
    v_ptr,
    bt_row,
    pos,
    pos_ok,
    kv_head,
    d,
    stride_kb,
    stride_ks,
    stride_kh,
    stride_vb,
    stride_vs,
    stride_vh,
    BLOCK_SIZE: tl.constexpr,
    UPCAST: tl.constexpr,
):
    """K and V [BLOCK_N, HEAD_DIM] of positions ``pos`` of one KV head (masked rows: 0)."""
    block = tl.load(bt_row + pos // BLOCK_SIZE, mask=pos_ok, other=0).to(tl.int64)
    k_off = block * stride_kb + (pos % BLOCK_SIZE) * stride_ks + kv_head * stride_kh
    v_off = block * stride_vb + (pos % BLOCK_SIZE) * stride_vs + kv_head * stride_vh
    k = tl.load(k_ptr + k_off[:, None] + d[None, :], mask=pos_ok[:, None], other=0.0)
    v = tl.load(v_ptr + v_off[:, None] + d[None, :], mask=pos_ok[:, None], other=0.0)
    if UPCAST:
        k = k.to(tl.float32)
        v = v.to(tl.float32)
    return k, v


# A Triton kernel: untyped by design (engine/runtime/kernels/triton/_common.py)
@triton.jit  # type: ignore[untyped-decorator]
def online_softmax_update(s, v, m_i, l_i, acc, PRECISION: tl.constexpr):  # type: ignore[no-untyped-def]
    """Fold one tile of base-2 scores s [M, N] and values v [N, D] into (m, l, acc)."""
    m_new = tl.maximum(m_i, tl.max(s, 1))
    alpha = tl.exp2(m_i - m_new)
    p = tl.exp2(s - m_new[:, None])
    l_i = l_i * alpha + tl.sum(p, 1)
    acc = acc * alpha[:, None] + tl.dot(p.to(v.dtype), v, input_precision=PRECISION)
    return m_new, l_i, acc


# A Triton kernel: untyped by design (engine/runtime/kernels/triton/_common.py)
@triton.jit
def merge_partial(m_i, l_i, acc, lse_p, o_p):  # type: ignore[no-untyped-def]
    """Fold a normalized partial (o_p [M, D], base-2 log-sum-exp lse_p [M]) into (m, l, acc);
    an empty partial has lse_p = -inf and leaves them unchanged."""
    m_new = tl.maximum(m_i, lse_p)
    m_ref = tl.where(m_new == float("-inf"), 0.0, m_new)
    alpha = tl.exp2(m_i - m_ref)
    beta = tl.exp2(lse_p - m_ref)
    return m_new, l_i * alpha + beta, acc * alpha[:, None] + o_p * beta[:, None]
