"""Attention metadata for one ragged forward (built by the runner, read by every attention op).

T = total new tokens in the batch, B = requests. Request i owns query rows
``query_start_loc[i] : query_start_loc[i+1]``; its new tokens sit at absolute positions
``context_lens[i] .. seq_lens[i]-1`` and attend causally to every position ``<=`` their own,
reading K/V through ``block_tables[i]`` (logical block j -> physical block id)::

    k_cache[num_blocks, block_size, num_kv_heads, head_dim]   (same for v_cache)
    slot = block_id * block_size + offset                      (slot_mapping, one per new token)
"""

from __future__ import annotations

from dataclasses import dataclass

import torch


@dataclass(frozen=True)
class AttentionMetadata:
    query_start_loc: torch.Tensor  # int32 [B + 1]
    context_lens: torch.Tensor  # int32 [B]   cached tokens before this chunk
    seq_lens: torch.Tensor  # int32 [B]       context_lens + new tokens
    block_tables: torch.Tensor  # int32 [B, max_blocks], rows padded with 0
    slot_mapping: torch.Tensor  # int64 [T]
    max_query_len: int
    max_seq_len: int
    block_size: int
    # Leading block ids identical in every row AND inside every request's cached context
    # (<= min(context_lens) // block_size): the shared prefix a cascade kernel may read once.
    num_shared_blocks: int = 0
    # Batch indices of the one-token requests (decode rows) of a batch that also holds longer
    # chunks: the Triton path attends them with the split-KV kernel, which reads each K/V tile
    # once per GQA group instead of once per query head. None: no such rows, or not built.
    decode_seqs: torch.Tensor | None = None  # int32 [n]
    # Validated once for this step (engine.runtime.kernels.check_step) for the backend it runs
    # on: kernels skip their own checks.
    checked: bool = False

    @property
    def num_seqs(self) -> int:
        return int(self.context_lens.shape[0])

    @property
    def is_decode_only(self) -> bool:
        return self.max_query_len == 1
