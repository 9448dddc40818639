"""Shared-prefix (cascade) attention and the rule for when the engine uses it.

When every request of a batch starts with the same ``meta.num_shared_blocks`` blocks (one tenant's
pinned system prompt), attention splits at S = num_shared_blocks * block_size::

    keys of request b:  [0 ........ S) shared, same physical blocks | [S .... seq_len_b) own
    pass 1  all T query rows of the batch (x GQA group) vs the shared keys, unmasked: the split-KV
            kernel with ONE segment, so each shared K/V tile is read once per row tile, not once
            per request
    pass 2  each request's rows vs its own keys [S, seq_len): split-KV decode (decode-only batch)
            or the extend kernel (mixed batch), both started at kv_lo = S
    merge   log-sum-exp weighted sum of the partials of both passes

Every query sits at a position >= context_len >= S, so no causal mask touches the shared part.
"""

from __future__ import annotations

import torch
import triton

from engine.kernels.metadata import AttentionMetadata
from engine.kernels.triton._common import check_kv_cache, check_metadata, check_query
from engine.kernels.triton.decode import (
    choose_num_splits,
    merge_partials,
    new_partials,
    split_kv_partials,
    tile_config,
)
from engine.kernels.triton.prefill import extend_partials

CASCADE_MIN_SHARED_TOKENS = 256
CASCADE_MIN_SAVED_TOKENS = 4096
CASCADE_MAX_QUERY_PER_SEQ = 64


def use_cascade(
    num_shared_blocks: int, block_size: int, num_seqs: int, num_query_tokens: int
) -> bool:
    """True when cascade attention is expected to beat per-request attention for this batch.

    Cascade saves re-reading the shared prefix: (num_seqs - 1) * S token rows of K and V. It costs
    two extra launches (a few microseconds) and an fp32 partial output + log-sum-exp per query row
    and split, written then merged. So it is chosen when

    * S >= CASCADE_MIN_SHARED_TOKENS (256): a shorter prefix is read faster than the extra
      launches and partials cost;
    * (num_seqs - 1) * S >= CASCADE_MIN_SAVED_TOKENS (4096 token rows, e.g. 2 requests x 4k or
      17 requests x 256): enough traffic is saved to pay for the merge;
    * num_query_tokens <= CASCADE_MAX_QUERY_PER_SEQ * num_seqs (64 new tokens per request on
      average): requests with long chunks already reuse each prefix tile across a whole query
      tile in the extend kernel and are compute bound, so sharing the reads gains little there.
    """
    shared_tokens = num_shared_blocks * block_size
    return (
        num_seqs >= 2
        and shared_tokens >= CASCADE_MIN_SHARED_TOKENS
        and (num_seqs - 1) * shared_tokens >= CASCADE_MIN_SAVED_TOKENS
        and num_query_tokens <= CASCADE_MAX_QUERY_PER_SEQ * num_seqs
    )


def _suffix_partials(
    q: torch.Tensor,
    k_cache: torch.Tensor,
    v_cache: torch.Tensor,
    meta: AttentionMetadata,
    scale: float,
    shared_tokens: int,
    num_splits: int | None,
) -> tuple[torch.Tensor, torch.Tensor, int]:
    """Buffers with the suffix partials in their last slots; returns (part_o, part_lse, first)."""
    group = q.shape[1] // k_cache.shape[2]
    block_n = tile_config(q.shape[2], group)[1]
    rows = q.shape[0] * group
    shared_splits = num_splits or choose_num_splits(
        triton.cdiv(rows, tile_config(q.shape[2], group)[0]) * k_cache.shape[2],
        shared_tokens,
        block_n,
        q.device,
    )
    suffix_kv = max(1, meta.max_seq_len - shared_tokens)
    if meta.is_decode_only and q.shape[0] == meta.num_seqs:
        suffix_splits = num_splits or choose_num_splits(
            meta.num_seqs * k_cache.shape[2], suffix_kv, block_n, q.device
        )
        part_o, part_lse = new_partials(shared_splits + suffix_splits, q)
        split_kv_partials(
            q, k_cache, v_cache, meta.block_tables, meta.query_start_loc, meta.seq_lens,
            kv_lo=shared_tokens, max_rows=1, max_kv=suffix_kv, num_splits=suffix_splits,
            part_o=part_o, part_lse=part_lse, part_base=shared_splits, scale=scale,
        )  # fmt: skip
    else:
        part_o, part_lse = new_partials(shared_splits + 1, q)
        extend_partials(
            q, k_cache, v_cache, meta, scale, out=part_o[shared_splits],
            lse=part_lse[shared_splits], kv_lo=shared_tokens,
        )  # fmt: skip
    return part_o, part_lse, shared_splits


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
    split count of both passes (tests). Returns out [T, Hq, D] in q's dtype.
    """
    check_kv_cache(k_cache, v_cache)
    check_query(q, k_cache)
    check_metadata(meta, k_cache, q.shape[0])
    if meta.num_shared_blocks < 1:
        raise ValueError("cascade attention needs meta.num_shared_blocks >= 1")
    out = torch.empty_like(q)
    if q.shape[0] == 0:
        return out
    shared_tokens = meta.num_shared_blocks * meta.block_size
    part_o, part_lse, shared_splits = _suffix_partials(
        q, k_cache, v_cache, meta, scale, shared_tokens, num_splits
    )
    # one segment: every query token of the batch, keys [0, S) through block_tables[0]
    seg_q = torch.arange(2, dtype=torch.int32, device=q.device) * q.shape[0]
    seg_kv = torch.full((1,), shared_tokens, dtype=torch.int32, device=q.device)
    split_kv_partials(
        q, k_cache, v_cache, meta.block_tables, seg_q, seg_kv, kv_lo=0, max_rows=q.shape[0],
        max_kv=shared_tokens, num_splits=shared_splits, part_o=part_o, part_lse=part_lse,
        part_base=0, scale=scale,
    )  # fmt: skip
    merge_partials(part_o, part_lse, out)
    return out
