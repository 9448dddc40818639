"""Paged-batch factory and float64 torch references for the kernel tests."""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass

import torch

from engine.runtime.kernels.metadata import AttentionMetadata

# (atol, rtol) of an attention output vs the float64 reference, by input dtype
TOLERANCE = {
    torch.float32: (2e-5, 1e-4),
    torch.float16: (2e-3, 1e-2),
    torch.bfloat16: (2e-2, 3e-2),
}


@dataclass
class PagedBatch:
    q: torch.Tensor  # [T, Hq, D]
    k_cache: torch.Tensor  # [num_blocks, block_size, Hkv, D]
    v_cache: torch.Tensor
    meta: AttentionMetadata
    scale: float


def make_batch(
    context_lens: Sequence[int],
    new_lens: Sequence[int],
    *,
    block_size: int,
    num_heads: int,
    num_kv_heads: int,
    head_dim: int = 64,
    dtype: torch.dtype = torch.float32,
    device: torch.device | str = "cpu",
    shared_blocks: int = 0,
    seed: int = 0,
) -> PagedBatch:
    """Random caches filled for every position; block ids shuffled so tables are non-trivial.

    The first ``shared_blocks`` logical blocks of every request map to the same physical blocks.
    """
    gen = torch.Generator().manual_seed(seed)
    seq_lens = [c + n for c, n in zip(context_lens, new_lens, strict=True)]
    per_seq = [math.ceil(s / block_size) for s in seq_lens]
    max_blocks = max(max(per_seq), shared_blocks, 1)
    num_blocks = shared_blocks + sum(n - shared_blocks for n in per_seq) + 3  # 3 unused
    ids = torch.randperm(num_blocks, generator=gen).tolist()
    shared, rest = ids[:shared_blocks], ids[shared_blocks:]
    table = torch.zeros(len(seq_lens), max_blocks, dtype=torch.int32)
    for i, n in enumerate(per_seq):
        own = [rest.pop() for _ in range(n - shared_blocks)]
        table[i, :n] = torch.tensor(shared + own, dtype=torch.int32)
    shape = (num_blocks, block_size, num_kv_heads, head_dim)
    k_cache = torch.randn(shape, generator=gen).to(dtype)
    v_cache = torch.randn(shape, generator=gen).to(dtype)
    q = torch.randn(sum(new_lens), num_heads, head_dim, generator=gen).to(dtype)
    qsl = torch.tensor([0, *torch.tensor(list(new_lens)).cumsum(0).tolist()], dtype=torch.int32)
    slots = [
        int(table[i, p // block_size]) * block_size + p % block_size
        for i, (c, s) in enumerate(zip(context_lens, seq_lens, strict=True))
        for p in range(c, s)
    ]
    meta = AttentionMetadata(
        query_start_loc=qsl.to(device),
        context_lens=torch.tensor(list(context_lens), dtype=torch.int32, device=device),
        seq_lens=torch.tensor(seq_lens, dtype=torch.int32, device=device),
        block_tables=table.to(device),
        slot_mapping=torch.tensor(slots, dtype=torch.int64, device=device),
        max_query_len=max(new_lens),
        max_seq_len=max(seq_lens),
        block_size=block_size,
        num_shared_blocks=shared_blocks,
    )
    return PagedBatch(q.to(device), k_cache.to(device), v_cache.to(device), meta, head_dim**-0.5)


def gather_kv(cache: torch.Tensor, table_row: torch.Tensor, length: int) -> torch.Tensor:
    """Positions 0..length-1 of one request: [length, Hkv, D]."""
    pos = torch.arange(length)
    block_size = cache.shape[1]
    return cache[table_row.long()[pos // block_size], pos % block_size]


def ref_attention(batch: PagedBatch) -> torch.Tensor:
    """float64 causal attention of each request's new tokens over its whole sequence."""
    m = batch.meta
    q = batch.q.double().cpu()
    k_cache, v_cache = batch.k_cache.double().cpu(), batch.v_cache.double().cpu()
    group = q.shape[1] // k_cache.shape[2]
    out = torch.zeros_like(q)
    qsl, ctx, seq = (m.query_start_loc.tolist(), m.context_lens.tolist(), m.seq_lens.tolist())
    for b in range(m.num_seqs):
        rows = slice(qsl[b], qsl[b + 1])
        k = gather_kv(k_cache, m.block_tables[b].cpu(), seq[b]).repeat_interleave(group, dim=1)
        v = gather_kv(v_cache, m.block_tables[b].cpu(), seq[b]).repeat_interleave(group, dim=1)
        scores = torch.einsum("thd,khd->htk", q[rows], k) * batch.scale
        q_pos = torch.arange(ctx[b], seq[b])[:, None]
        scores = scores.masked_fill(torch.arange(seq[b])[None, :] > q_pos, float("-inf"))
        out[rows] = torch.einsum("htk,khd->thd", scores.softmax(-1), v)
    return out


def assert_close(actual: torch.Tensor, expected: torch.Tensor, dtype: torch.dtype) -> None:
    atol, rtol = TOLERANCE[dtype]
    torch.testing.assert_close(actual.double().cpu(), expected.double(), atol=atol, rtol=rtol)
