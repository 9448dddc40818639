"""kvgate's C ops of a CPU step (``engine/runtime/kernels/cpu/ops.c``, ``attention.c``), each ISA
build this CPU runs, against the torch reference and float64: RMSNorm with and without the
residual, RoPE with the K/V store on the decoder's fused q/k/v views, attention (decode rows and
prefill chunks) through shuffled block tables with GQA; the same bits from both builds; what the
dispatcher sends where."""

from __future__ import annotations

import dataclasses

import pytest
import torch

from engine.runtime import kernels
from engine.runtime.kernels import reference
from engine.runtime.kernels.cpu import ops
from tests.kernels.helpers import assert_close, make_batch, ref_attention

RUNNABLE = {"AVX512": ["avx512", "avx2"], "AVX2": ["avx2"]}.get(
    torch.backends.cpu.get_cpu_capability(), []
)
HQ, HKV, D = 6, 2, 32


@pytest.fixture(params=["avx512", "avx2"])
def c_ops(request: pytest.FixtureRequest) -> ops.CpuOps:
    if request.param not in RUNNABLE:
        pytest.skip(f"this CPU cannot run the {request.param} build")
    built = ops.load(request.param)
    if built is None:
        pytest.skip("no C compiler")
    return built


@pytest.mark.parametrize("hidden", [576, 37])
def test_rms_norm_with_and_without_the_residual(c_ops: ops.CpuOps, hidden: int) -> None:
    x, w, res = torch.randn(5, hidden), torch.rand(hidden) + 0.5, torch.randn(5, hidden)
    torch.testing.assert_close(c_ops.rms_norm(x, w, 1e-6, None), reference.rms_norm(x, w, 1e-6))
    mine, ref_res = res.clone(), res.clone()
    got, total = c_ops.rms_norm(x, w, 1e-6, mine)
    want, want_total = reference.rms_norm(x, w, 1e-6, ref_res)
    assert total is mine and torch.equal(mine, want_total)  # the sum, in place
    torch.testing.assert_close(got, want)


def _qkv(tokens: int, seed: int = 0) -> torch.Tensor:
    return torch.randn(tokens, (HQ + 2 * HKV) * D, generator=torch.Generator().manual_seed(seed))


def _split(qkv: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    t = qkv.shape[0]
    q = qkv[:, : HQ * D].view(t, HQ, D)
    k = qkv[:, HQ * D : (HQ + HKV) * D].view(t, HKV, D)
    v = qkv[:, (HQ + HKV) * D :].view(t, HKV, D)
    return q, k, v


@pytest.mark.parametrize("tokens", [1, 4])
def test_rope_and_store_on_the_decoders_views(c_ops: ops.CpuOps, tokens: int) -> None:
    positions = torch.tensor([7, 0, 130, 2][:tokens], dtype=torch.int64)
    slots = torch.tensor([5, 1, 9, 2][:tokens], dtype=torch.int64)
    angles = torch.outer(torch.arange(256.0), torch.rand(D // 2))
    cos, sin = torch.cat((angles, angles), -1).cos(), torch.cat((angles, angles), -1).sin()
    caches = [torch.zeros(3, 4, HKV, D) for _ in range(4)]
    mine, theirs = _qkv(tokens), _qkv(tokens)
    fused = ops.rope_operands(*_split(mine))
    assert fused is not None
    c_ops.rope_store_kv(fused[0], fused[1], positions, cos, sin, caches[0], caches[1], slots)
    q, k, v = _split(theirs)
    reference.rope_store_kv(q, k, v, positions, cos, sin, caches[2], caches[3], slots)
    torch.testing.assert_close(_split(mine)[0], q)
    torch.testing.assert_close(caches[0], caches[2])
    assert torch.equal(caches[1], caches[3])  # v is copied as it is


def test_views_of_another_layout_are_not_taken_for_fused_qkv() -> None:
    q, k, v = _split(_qkv(3))
    assert ops.rope_operands(q, k, v.clone()) is None
    assert ops.rope_operands(q.contiguous(), k, v) is None


CASES = [
    ((0, 31, 16), 16, 4, 2),
    ((47, 5, 200), 2, 6, 2),
    ((20,), 1, 7, 1),
    ((63, 1), 64, 8, 8),
    ((40, 9), 8, 72, 8),  # more heads than a decode row takes as one item: tiles of heads
]


@pytest.mark.parametrize(("ctx", "block_size", "heads", "kv_heads"), CASES)
def test_paged_attention_matches_float64(
    c_ops: ops.CpuOps, ctx: tuple[int, ...], block_size: int, heads: int, kv_heads: int
) -> None:
    batch = make_batch(
        ctx, [1] * len(ctx), block_size=block_size, num_heads=heads, num_kv_heads=kv_heads
    )
    out = c_ops.paged_attention(batch.q, batch.k_cache, batch.v_cache, batch.meta, batch.scale)
    assert_close(out, ref_attention(batch), torch.float32)
    alone = make_batch(ctx[:1], [1], block_size=block_size, num_heads=heads, num_kv_heads=kv_heads)
    one = c_ops.paged_attention(alone.q, alone.k_cache, alone.v_cache, alone.meta, alone.scale)
    assert_close(one, ref_attention(alone), torch.float32)


EXTEND = [((0, 31, 16), (5, 1, 9)), ((0,), (70,)), ((13, 0, 2), (0, 4, 1))]


@pytest.mark.parametrize(("ctx", "new"), EXTEND)
def test_prefill_chunks_match_float64(
    c_ops: ops.CpuOps, ctx: tuple[int, ...], new: tuple[int, ...]
) -> None:
    """Causal chunks after a cached context (first prefills, chunks of every tile size, a request
    with no new rows in the batch) beside decode rows; shared leading blocks."""
    batch = make_batch(ctx, new, block_size=8, num_heads=6, num_kv_heads=2, shared_blocks=1)
    out = c_ops.paged_attention(batch.q, batch.k_cache, batch.v_cache, batch.meta, batch.scale)
    assert_close(out, ref_attention(batch), torch.float32)


@pytest.mark.parametrize(("heads", "kv_heads"), [(6, 2), (7, 1), (32, 8), (72, 8)])
def test_a_rows_result_does_not_depend_on_its_chunk(
    c_ops: ops.CpuOps, heads: int, kv_heads: int
) -> None:
    """Row i of a 7-row chunk after 30 cached keys gives the same bits as that row decoded
    alone after 30 + i keys: row tiles of all heads (4 rows, then 3; 2 rows of 32 heads; a
    decode row alone), or with more than 64 heads tiles of one kv head."""
    b = make_batch((30,), (7,), block_size=4, num_heads=heads, num_kv_heads=kv_heads)
    chunk = c_ops.paged_attention(b.q, b.k_cache, b.v_cache, b.meta, b.scale)
    for i in range(7):
        meta = dataclasses.replace(
            b.meta,
            query_start_loc=torch.tensor([0, 1], dtype=torch.int32),
            context_lens=torch.tensor([30 + i], dtype=torch.int32),
            seq_lens=torch.tensor([31 + i], dtype=torch.int32),
            max_query_len=1,
            max_seq_len=31 + i,
        )
        alone = c_ops.paged_attention(b.q[i : i + 1], b.k_cache, b.v_cache, meta, b.scale)
        assert torch.equal(alone[0], chunk[i]), i


def test_attention_gives_the_same_bits_on_any_thread_count(c_ops: ops.CpuOps) -> None:
    """A chunk's rows are cut into as many tiles as make them even over the threads (19 rows:
    5 tiles of 4 on one thread, 6 of 3-4 on two or three): the bits stay the same."""
    b = make_batch((300, 0, 41, 700), (1, 23, 1, 19), block_size=16, num_heads=9, num_kv_heads=3)
    args = (b.q, b.k_cache, b.v_cache, b.meta, b.scale)
    before = torch.get_num_threads()
    try:
        torch.set_num_threads(1)
        one = c_ops.paged_attention(*args)
        for threads in (2, 3):
            torch.set_num_threads(threads)
            assert torch.equal(c_ops.paged_attention(*args), one), threads
    finally:
        torch.set_num_threads(before)


@pytest.mark.parametrize("head_dim", [16, 80, 256])
def test_paged_attention_head_dims_and_sharp_scores(c_ops: ops.CpuOps, head_dim: int) -> None:
    """Any multiple of 16 up to the largest head dim; contexts that are not a whole number of
    16-key groups; scores far apart (most numerators underflow to 0, as in float64 they are
    below float32's normal range)."""
    batch = make_batch((300, 16, 0), (1, 1, 1), block_size=16, num_heads=9, num_kv_heads=3,
                       head_dim=head_dim)  # fmt: skip
    out = c_ops.paged_attention(batch.q, batch.k_cache, batch.v_cache, batch.meta, batch.scale)
    assert_close(out, ref_attention(batch), torch.float32)
    sharp = batch.q * 40.0
    out = c_ops.paged_attention(sharp, batch.k_cache, batch.v_cache, batch.meta, batch.scale)
    assert_close(out, ref_attention(dataclasses.replace(batch, q=sharp)), torch.float32)


def test_head_dims_the_c_attention_cannot_run_take_the_reference() -> None:
    c = ops.default()
    if c is None:
        pytest.skip("kvgate's C ops are not built here")
    assert c.attends(64) and c.attends(c.max_head_dim)
    assert not c.attends(40) and not c.attends(c.max_head_dim + 16)
    batch = make_batch((21, 5), (1, 1), block_size=4, num_heads=4, num_kv_heads=2, head_dim=40)
    out = kernels.paged_attention(batch.q, batch.k_cache, batch.v_cache, batch.meta, batch.scale)
    assert_close(out, ref_attention(batch), torch.float32)


@pytest.mark.skipif(len(RUNNABLE) < 2, reason="needs a CPU that runs both builds")
def test_both_builds_give_the_same_bits() -> None:
    wide, narrow = ops.load("avx512"), ops.load("avx2")
    assert wide is not None and narrow is not None
    for new in ((1, 1, 1), (6, 1, 3)):
        b = make_batch((40, 3, 77), new, block_size=4, num_heads=6, num_kv_heads=2)
        args = (b.q, b.k_cache, b.v_cache, b.meta, b.scale)
        assert torch.equal(wide.paged_attention(*args), narrow.paged_attention(*args))
    x, w = torch.randn(3, 100), torch.rand(100)
    assert torch.equal(wide.rms_norm(x, w, 1e-5, None), narrow.rms_norm(x, w, 1e-5, None))


def test_the_dispatcher_sends_float32_attention_to_c_and_the_rest_to_the_reference(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    if ops.default() is None:
        pytest.skip("kvgate's C ops are not built here")
    calls: list[str] = []
    real = ops.CpuOps.paged_attention
    monkeypatch.setattr(
        ops.CpuOps, "paged_attention", lambda self, *a: calls.append("c") or real(self, *a)
    )
    decode = make_batch((9, 30), (1, 1), block_size=4, num_heads=4, num_kv_heads=2)
    kernels.paged_attention(decode.q, decode.k_cache, decode.v_cache, decode.meta, decode.scale)
    extend = make_batch((9, 30), (3, 1), block_size=4, num_heads=4, num_kv_heads=2)
    out = kernels.paged_attention(
        extend.q, extend.k_cache, extend.v_cache, extend.meta, extend.scale
    )
    assert_close(out, ref_attention(extend), torch.float32)
    half = make_batch((9,), (1,), block_size=4, num_heads=4, num_kv_heads=2, dtype=torch.bfloat16)
    kernels.paged_attention(half.q, half.k_cache, half.v_cache, half.meta, half.scale)
    assert calls == ["c", "c"]
