"""The block GEMM over GGUF Q4_1 / Q8_0 weights, each ISA build this CPU runs: against the
dequantized weights in float64, shapes with tails, bias, batch and thread invariance, the same
bits from both builds; GGUF bytes parsed as ``gguf.quants`` dequantizes them; Linear's choice."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from gguf import GGMLQuantizationType
from gguf.quants import dequantize, quantize

from engine.runtime.kernels.cpu import qgemm
from engine.runtime.model.blocks import Q4_1, Q8_0, BlockWeight, cat_rows, embed
from engine.runtime.model.linear import Linear

RUNNABLE = {"AVX512": ["avx512", "avx2"], "AVX2": ["avx2"]}.get(
    torch.backends.cpu.get_cpu_capability(), []
)
GGML = {Q4_1: GGMLQuantizationType.Q4_1, Q8_0: GGMLQuantizationType.Q8_0}


@pytest.fixture(params=["avx512", "avx2"])
def kernel(request: pytest.FixtureRequest) -> qgemm.QuantGemm:
    if request.param not in RUNNABLE:
        pytest.skip(f"this CPU cannot run the {request.param} build")
    built = qgemm.load(request.param)
    if built is None:
        pytest.skip("no C compiler")
    return built


def block_weight(kind: str, n: int, k: int, seed: int = 0) -> BlockWeight:
    """A weight quantized by the ``gguf`` package, as a GGUF file stores it."""
    w = np.random.default_rng(seed).standard_normal((n, k)).astype(np.float32) * 0.05
    return BlockWeight.from_gguf(kind, quantize(w, GGML[kind]), (n, k))


def pack(kernel: qgemm.QuantGemm, w: BlockWeight) -> qgemm.PackedBlocks:
    if w.m is None:
        return kernel.pack_q8_0(w.q, w.d)
    return kernel.pack_q4_1(w.q, w.d, w.m)


@pytest.mark.parametrize("kind", [Q4_1, Q8_0])
def test_blocks_parse_to_what_gguf_dequantizes(kind: str) -> None:
    raw = quantize(np.linspace(-1, 1, 40 * 96, dtype=np.float32).reshape(40, 96), GGML[kind])
    w = BlockWeight.from_gguf(kind, raw, (40, 96))
    want = torch.from_numpy(dequantize(raw, GGML[kind]).reshape(40, 96))
    assert torch.equal(w.dequantize(), want)
    rows = torch.tensor([3, 0, 39])
    assert torch.equal(w.dequantize(rows), want[rows])
    assert torch.equal(embed(w, rows), want[rows])


@pytest.mark.parametrize("kind", [Q4_1, Q8_0])
@pytest.mark.parametrize(("m", "n", "k"), [(1, 64, 32), (3, 40, 96), (8, 100, 576), (131, 17, 64)])
def test_matches_the_dequantized_weight(
    kernel: qgemm.QuantGemm, kind: str, m: int, n: int, k: int
) -> None:
    w = block_weight(kind, n, k, seed=m)
    x, b = torch.randn(m, k), torch.randn(n)
    got = kernel.matmul(x, pack(kernel, w), b)
    want = x.double() @ w.dequantize().double().T + b.double()
    scale = (x.abs().double() @ w.dequantize().abs().double().T).clamp_min(1.0)
    assert ((got.double() - want).abs() <= 1e-5 * scale).all()
    assert kernel.matmul(x[:0], pack(kernel, w), None).shape == (0, n)


@pytest.mark.parametrize("kind", [Q4_1, Q8_0])
def test_a_row_does_not_depend_on_batch_or_threads(kernel: qgemm.QuantGemm, kind: str) -> None:
    w = block_weight(kind, 3072, 576)
    packed, x = pack(kernel, w), torch.randn(9, 576)
    alone = kernel.matmul(x[4:5], packed, None)
    before = torch.get_num_threads()
    try:
        for threads in (1, 2, 3):
            torch.set_num_threads(threads)
            assert torch.equal(kernel.matmul(x, packed, None)[4:5], alone)
    finally:
        torch.set_num_threads(before)


@pytest.mark.skipif(len(RUNNABLE) < 2, reason="needs a CPU that runs both builds")
@pytest.mark.parametrize("kind", [Q4_1, Q8_0])
def test_both_builds_give_the_same_bits(kind: str) -> None:
    w, x = block_weight(kind, 200, 320), torch.randn(7, 320)
    wide, narrow = qgemm.load("avx512"), qgemm.load("avx2")
    assert wide is not None and narrow is not None
    assert torch.equal(wide.matmul(x, pack(wide, w), None), narrow.matmul(x, pack(narrow, w), None))


def test_bad_arguments_are_refused_before_the_call_into_c(kernel: qgemm.QuantGemm) -> None:
    w = block_weight(Q4_1, 64, 64)
    packed = pack(kernel, w)
    with pytest.raises(ValueError, match="32 columns, the weight 64"):
        kernel.matmul(torch.randn(2, 32), packed, None)
    with pytest.raises(ValueError, match="float32"):
        kernel.matmul(torch.randn(2, 64).double(), packed, None)
    with pytest.raises(ValueError, match="bias"):
        kernel.matmul(torch.randn(2, 64), packed, torch.randn(63))
    with pytest.raises(ValueError, match="scales"):
        kernel.pack_q4_1(w.q[:, :48], w.d, w.m if w.m is not None else w.d)


def test_linear_keeps_the_blocks_and_falls_back_to_float(monkeypatch: pytest.MonkeyPatch) -> None:
    w, b, x = block_weight(Q4_1, 96, 64), torch.randn(96), torch.randn(2, 5, 64)
    want = torch.nn.functional.linear(x, w.dequantize(), b)
    layer = Linear(w, b)
    if qgemm.load() is not None:
        assert layer.weight is None  # the blocks are the only copy
    assert torch.allclose(layer(x), want, atol=1e-4)
    monkeypatch.setattr(qgemm, "load", lambda isa=None: None)
    plain = Linear(w, b)  # no block GEMM: dequantized once, the float paths
    assert torch.allclose(plain(x), want, atol=1e-4)


def test_rows_of_one_format_stay_in_blocks() -> None:
    a, b = block_weight(Q4_1, 8, 64), block_weight(Q4_1, 4, 64, seed=1)
    both = cat_rows([a, b])
    assert isinstance(both, BlockWeight) and both.shape == (12, 64)
    assert torch.equal(both.dequantize(), torch.cat([a.dequantize(), b.dequantize()]))
    mixed = cat_rows([a, block_weight(Q8_0, 4, 64)])
    assert isinstance(mixed, torch.Tensor) and mixed.shape == (12, 64)
