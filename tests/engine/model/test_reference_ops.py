"""store_kv + paged_attention (torch reference) against dense causal attention."""

from __future__ import annotations

import math

import pytest
import torch

from engine.runtime.kernels import paged_attention, store_kv
from engine.runtime.kernels.metadata import AttentionMetadata

HQ, HKV, D = 4, 2, 8


def _dense(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
    """Plain causal attention of a whole sequence [S, H, D] (K/V heads repeated)."""
    k = k.repeat_interleave(HQ // HKV, dim=1)
    v = v.repeat_interleave(HQ // HKV, dim=1)
    scores = torch.einsum("qhd,khd->hqk", q, k) / math.sqrt(D)
    s = q.shape[0]
    scores = scores.masked_fill(torch.ones(s, s).triu(1).bool(), float("-inf"))
    return torch.einsum("hqk,khd->qhd", scores.softmax(-1), v)


def _run(lens: list[tuple[int, int]], bs: int, seed: int) -> tuple[torch.Tensor, torch.Tensor]:
    """lens: (cached, new) per request. Returns (paged output, dense reference) of new rows."""
    gen = torch.Generator().manual_seed(seed)
    num_blocks = 64
    kc = torch.zeros(num_blocks, bs, HKV, D)
    vc = torch.zeros_like(kc)
    free = torch.randperm(num_blocks, generator=gen).tolist()
    tables, qs, ks, vs, slots, refs = [], [], [], [], [], []
    for ctx, n in lens:
        s = ctx + n
        table = [free.pop() for _ in range((s + bs - 1) // bs)]
        tables.append(table)
        q, k, v = (torch.randn(s, h, D, generator=gen) for h in (HQ, HKV, HKV))
        slot = [table[p // bs] * bs + p % bs for p in range(s)]
        store_kv(k[:ctx], v[:ctx], kc, vc, torch.tensor(slot[:ctx], dtype=torch.int64))
        qs.append(q[ctx:])
        ks.append(k[ctx:])
        vs.append(v[ctx:])
        slots += slot[ctx:]
        refs.append(_dense(q, k, v)[ctx:])
    width = max(len(t) for t in tables)
    starts = [0]
    for _, n in lens:
        starts.append(starts[-1] + n)
    meta = AttentionMetadata(
        query_start_loc=torch.tensor(starts, dtype=torch.int32),
        context_lens=torch.tensor([c for c, _ in lens], dtype=torch.int32),
        seq_lens=torch.tensor([c + n for c, n in lens], dtype=torch.int32),
        block_tables=torch.tensor([t + [0] * (width - len(t)) for t in tables], dtype=torch.int32),
        slot_mapping=torch.tensor(slots, dtype=torch.int64),
        max_query_len=max(n for _, n in lens),
        max_seq_len=max(c + n for c, n in lens),
        block_size=bs,
    )
    store_kv(torch.cat(ks), torch.cat(vs), kc, vc, meta.slot_mapping)
    out = paged_attention(torch.cat(qs), kc, vc, meta, 1 / math.sqrt(D))
    return out, torch.cat(refs)


@pytest.mark.parametrize("bs", [1, 4, 16])
@pytest.mark.parametrize(
    "lens",
    [
        [(0, 9)],  # one fresh prompt
        [(0, 5), (3, 4), (7, 1), (12, 2)],  # mixed prefill, chunk, decode
        [(5, 1), (9, 1), (2, 1), (30, 1)],  # decode-only batch (batched path)
        [(17, 1)],  # single decode
    ],
)
def test_paged_attention_matches_dense(lens: list[tuple[int, int]], bs: int) -> None:
    out, ref = _run(lens, bs, seed=bs)
    assert out.shape == ref.shape
    assert (out - ref).abs().max().item() < 1e-5


def test_store_kv_writes_exact_slots() -> None:
    kc = torch.zeros(4, 2, HKV, D)
    vc = torch.zeros_like(kc)
    key = torch.randn(3, HKV, D)
    store_kv(key, -key, kc, vc, torch.tensor([7, 0, 3]))
    assert torch.equal(kc[3, 1], key[0]) and torch.equal(kc[0, 0], key[1])
    assert torch.equal(vc[1, 1], -key[2])
    assert int((kc != 0).any(dim=(2, 3)).sum()) == 3
