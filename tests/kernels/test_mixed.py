"""Mixed batches: the one-token requests (``meta.decode_seqs``) go to the split-KV kernel, the
longer chunks to the extend kernel; together they give the reference attention."""

from __future__ import annotations

import dataclasses

import pytest
import torch

from engine.runtime.kernels.triton import VARIANTS, extend_attention, paged_attention
from tests.kernels.helpers import assert_close, make_batch, ref_attention

# (context_lens, new_lens, block_size, heads, kv_heads): decode rows first, last, interleaved,
# a one-token fresh prompt; GQA 1, 2, 7
CASES = [
    ((40, 0, 9), (1, 19, 1), 16, 4, 2),
    ((3, 70), (12, 1), 4, 7, 1),
    ((0, 5, 33, 2), (1, 9, 1, 1), 2, 2, 2),
]


def _with_decode_rows(batch):
    lens = (batch.meta.query_start_loc[1:] - batch.meta.query_start_loc[:-1]).tolist()
    rows = [i for i, n in enumerate(lens) if n == 1]
    seqs = torch.tensor(rows, dtype=torch.int32, device=batch.q.device)
    return dataclasses.replace(batch.meta, decode_seqs=seqs), len(rows)


@pytest.mark.parametrize(("ctx", "new", "block_size", "heads", "kv_heads"), CASES)
def test_mixed_batch_matches_reference(ctx, new, block_size, heads, kv_heads, device):
    batch = make_batch(
        ctx, new, block_size=block_size, num_heads=heads, num_kv_heads=kv_heads, device=device
    )
    meta, num_decode = _with_decode_rows(batch)
    assert num_decode >= 1
    VARIANTS.seen.clear()
    out = paged_attention(batch.q, batch.k_cache, batch.v_cache, meta, batch.scale)
    assert_close(out, ref_attention(batch), torch.float32)
    assert {key[0] for key in VARIANTS.seen} == {"_extend_kernel", "_split_kv_kernel"}


def test_mixed_path_launches_indexed_split_kv(device):
    batch = make_batch((21, 0), (1, 13), block_size=4, num_heads=4, num_kv_heads=1, device=device)
    meta, _ = _with_decode_rows(batch)
    VARIANTS.seen.clear()
    extend_attention(batch.q, batch.k_cache, batch.v_cache, meta, batch.scale)
    consts = [(k[0], dict(k[1])) for k in VARIANTS.seen]
    split = [c for name, c in consts if name == "_split_kv_kernel"]
    extend = [c for name, c in consts if name == "_extend_kernel"]
    assert [c["INDEXED"] for c in split] == ["True"] and [c["DIRECT"] for c in split] == ["True"]
    assert [c["SKIP_SINGLE"] for c in extend] == ["True"]


def test_without_decode_seqs_the_extend_kernel_does_all_rows(device):
    batch = make_batch((21, 0), (1, 13), block_size=4, num_heads=4, num_kv_heads=1, device=device)
    VARIANTS.seen.clear()
    out = extend_attention(batch.q, batch.k_cache, batch.v_cache, batch.meta, batch.scale)
    assert_close(out, ref_attention(batch), torch.float32)
    assert {k[0] for k in VARIANTS.seen} == {"_extend_kernel"}


def test_checked_metadata_skips_the_per_call_checks(device):
    batch = make_batch((4,), (4,), block_size=4, num_heads=3, num_kv_heads=1, device=device)
    bad_q = batch.q.half()  # would be refused by the checks
    with pytest.raises(ValueError, match="dtype"):
        extend_attention(bad_q, batch.k_cache, batch.v_cache, batch.meta, batch.scale)
    checked = dataclasses.replace(batch.meta, checked=True)
    out = extend_attention(batch.q, batch.k_cache, batch.v_cache, checked, batch.scale)
    assert_close(out, ref_attention(batch), torch.float32)
