"""Shared-prefix (cascade) attention and the rule for when the engine uses it.

When every request of a batch starts with the same ``meta.num_shared_blocks`` blocks (one tenant's
pinned system prompt), attention splits at S = num_shared_blocks * block_size::

    keys of request b:  [0 ........ S) shared, same physical blocks | [S .... seq_len_b) own
    pass 1  all T query rows of the batch (x GQA group) vs the shared keys, unmasked: the split-KV
            kernel with ONE segment, so each shared K/V tile is read once per row tile, not once
            per request
    pass 2  each request's rows vs its own keys [S, seq_len): split-KV decode (decode-only batch)
            or the extend kernel (mixed batch), both started at kv_lo = S
    merge   log-sum-exp weighted sum of the partials of both passes; a decode-only batch whose
            own keys need a single split merges inside pass 2 (two launches, no merge kernel)

Every query sits at a position >= context_len >= S, so no causal mask touches the shared part.
"""

from __future__ import annotations

import torch
import triton

from engine.runtime.kernels.cascade_rule import MIN_SPLIT_KEYS
from engine.runtime.kernels.metadata import AttentionMetadata
from engine.runtime.kernels.triton._common import check_attention
from engine.runtime.kernels.triton.decode import (
    Segments,
    merge_partials,
    new_partials,
    plan_splits,
    split_kv_partials,
    tile_config,
)
from engine.runtime.kernels.triton.prefill import extend_partials


def _suffix_plan(
    q: torch.Tensor,
    k_cache: torch.Tensor,
    meta: AttentionMetadata,
    shared_tokens: int,
    num_splits: int | None,
) -> tuple[Segments | None, tuple[int, int]]:
    """Pass 2 of a decode-only batch: split-KV segments and splits; (None, (1, 0)) when the
    extend kernel computes it as a single partial."""
    if not (meta.is_decode_only and q.shape[0] == meta.num_seqs):
        return None, (1, 0)
    suffix_kv = max(1, meta.max_seq_len - shared_tokens)
    segs = Segments(
        meta.block_tables, meta.query_start_loc, meta.seq_lens, shared_tokens, meta.max_seq_len, 1
    )
    group = q.shape[1] // k_cache.shape[2]
    block_n = tile_config(q.shape[2], group)[1]
    work = meta.num_seqs * k_cache.shape[2]
    splits = plan_splits(work, suffix_kv, block_n, q.device, num_splits, MIN_SPLIT_KEYS)
    return segs, splits


def cascade_attention(
    q: torch.Tensor,
    k_cache: torch.Tensor,
    v_cache: torch.Tensor,
    meta: AttentionMetadata,
    scale: float,
    *,
    num_splits: int | None = None,
) -> torch.Tensor:
    """Attention of a batch whose requests share ``meta.num_shared_blocks`` leading blocks.

    Same result as ``extend_attention`` / ``decode_attention``; ``num_splits`` overrides the KV
    split count of the split-KV passes (tests). Returns out [T, Hq, D] in q's dtype.
    """
    check_attention(q, k_cache, v_cache, meta)
    if meta.num_shared_blocks < 1:
        raise ValueError("cascade attention needs meta.num_shared_blocks >= 1")
    out = torch.empty_like(q)
    if q.shape[0] == 0:
        return out
    shared_tokens = meta.num_shared_blocks * meta.block_size
    rows = q.shape[0] * (q.shape[1] // k_cache.shape[2])
    block_m, block_n = tile_config(q.shape[2], rows)[:2]
    shared = Segments(meta.block_tables, None, None, 0, shared_tokens, max_rows=q.shape[0])
    work = triton.cdiv(rows, block_m) * k_cache.shape[2]
    shared_splits = plan_splits(work, shared_tokens, block_n, q.device, num_splits, MIN_SPLIT_KEYS)
    suffix, suffix_splits = _suffix_plan(q, k_cache, meta, shared_tokens, num_splits)
    first = shared_splits[0]
    fused = suffix is not None and suffix_splits[0] == 1
    part_o, part_lse = new_partials(first + (0 if fused else suffix_splits[0]), q)
    split_kv_partials(
        q, k_cache, v_cache, shared, splits=shared_splits, part_o=part_o, part_lse=part_lse,
        part_base=0, scale=scale,
    )  # fmt: skip
    if fused and suffix is not None:  # one suffix split merges the shared partials and writes out
        split_kv_partials(
            q, k_cache, v_cache, suffix, splits=suffix_splits, part_o=out, part_lse=out,
            part_base=0, scale=scale, out=out, merge_with=(part_o, part_lse),
        )  # fmt: skip
        return out
    if suffix is not None:
        split_kv_partials(
            q, k_cache, v_cache, suffix, splits=suffix_splits, part_o=part_o, part_lse=part_lse,
            part_base=first, scale=scale,
        )  # fmt: skip
    else:
        extend_partials(
            q, k_cache, v_cache, meta, scale, out=part_o[first], lse=part_lse[first],
            kv_lo=shared_tokens,
        )  # fmt: skip
    merge_partials(part_o, part_lse, out)
    return out
