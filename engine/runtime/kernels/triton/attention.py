"""Kernel choice for one ragged batch: what the engine's dispatch point runs for CUDA tensors.

cascade  requests share meta.num_shared_blocks leading blocks and use_cascade() says it pays
decode   every request has exactly one new token (meta.is_decode_only)
extend   anything else (prefill chunks, mixed prefill + decode batches)
"""

from __future__ import annotations

from typing import Literal

import torch

from engine.runtime.kernels.cascade_rule import use_cascade
from engine.runtime.kernels.metadata import AttentionMetadata
from engine.runtime.kernels.triton.cascade import cascade_attention
from engine.runtime.kernels.triton.decode import decode_attention
from engine.runtime.kernels.triton.prefill import extend_attention

KernelName = Literal["cascade", "decode", "extend"]


def choose_kernel(meta: AttentionMetadata, num_tokens: int) -> KernelName:
    """The attention kernel for ``num_tokens`` query tokens (pure: reads no tensor data)."""
    if meta.num_shared_blocks and use_cascade(
        meta.num_shared_blocks, meta.block_size, meta.num_seqs, num_tokens
    ):
        return "cascade"
    if meta.is_decode_only and num_tokens == meta.num_seqs:
        return "decode"
    return "extend"


def paged_attention(
    q: torch.Tensor,
    k_cache: torch.Tensor,
    v_cache: torch.Tensor,
    meta: AttentionMetadata,
    scale: float,
) -> torch.Tensor:
    """Causal attention of q [T, Hq, D] through the block tables; returns [T, Hq, D]."""
    kernel = choose_kernel(meta, q.shape[0])
    if kernel == "cascade":
        return cascade_attention(q, k_cache, v_cache, meta, scale)
    if kernel == "decode":
        return decode_attention(q, k_cache, v_cache, meta, scale)
    return extend_attention(q, k_cache, v_cache, meta, scale)
