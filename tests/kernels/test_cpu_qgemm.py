"""The block GEMM over GGUF Q4_1 / Q8_0 weights, each ISA build this CPU runs, with float32,
int16 and int8 activations: against the dequantized weights in float64 (int16 / int8: against
the same scheme computed in float64, and within its stated rounding bound), shapes with tails,
bias, batch and thread invariance, the same bits from both builds, no overflow at the extremes;
GGUF
bytes parsed as ``gguf.quants`` dequantizes them; Linear's choice; the thread pool every CPU
kernel's call splits over (``kvgate_parallel_for``), probed from C (``pool_probe.c``)."""

from __future__ import annotations

import ctypes
from pathlib import Path

import numpy as np
import pytest
import torch
from gguf import GGMLQuantizationType
from gguf.quants import dequantize, quantize

from engine.config import EngineConfig
from engine.runtime.kernels.cpu import build, qgemm
from engine.runtime.model.blocks import Q4_1, Q8_0, BlockWeight, cat_rows, embed
from engine.runtime.model.linear import Linear

RUNNABLE = {"AVX512": ["avx512", "avx2"], "AVX2": ["avx2"]}.get(
    torch.backends.cpu.get_cpu_capability(), []
)
GGML = {Q4_1: GGMLQuantizationType.Q4_1, Q8_0: GGMLQuantizationType.Q8_0}
POOL_PROBE = Path(__file__).with_name("pool_probe.c")


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


def pack(
    kernel: qgemm.QuantGemm, w: BlockWeight, activations: str = qgemm.FLOAT32
) -> qgemm.PackedBlocks:
    if w.m is None:
        return kernel.pack_q8_0(w.q, w.d, activations=activations)
    return kernel.pack_q4_1(w.q, w.d, w.m, activations=activations)


def integer_reference(
    x: torch.Tensor, w: BlockWeight, activations: str, bias: torch.Tensor | None = None
) -> torch.Tensor:
    """q8gemm.c's scheme, its float32 operations in its order: x rounded per block of 32
    (dx = max|x| / L, L = 127 for int8 or 32767 for int16, half to even), each block's exact
    integer dot product converted to float32 and added as ``fma(dw * dx, sum, y)``, then
    (Q4_1) ``fma(mw, sum(x), y)`` with sum(x) added in index order; the bias last. Each fma is
    a float64 product and sum rounded to float32, which can differ from a fused one by an ulp."""
    levels = float(qgemm.LEVELS[activations])
    m, k = x.shape
    xb = x.view(m, k // 32, 32)
    amax = xb.abs().amax(-1).double()  # divisions in float64, then rounded: IEEE float32's
    dx = (amax / levels).float()
    inv = torch.where(amax > 0, levels / amax, torch.zeros_like(amax)).float()
    qx = torch.round(xb * inv.unsqueeze(-1)).double()  # float32 product, then half to even
    qw = w.q.double().view(w.shape[0], k // 32, 32)
    sums = torch.einsum("mbi,nbi->mnb", qx, qw).float()  # exact integers, then float32
    xsum = torch.zeros(m, k // 32)
    for i in range(32):
        xsum = xsum + xb[..., i]
    out = torch.zeros(m, w.shape[0])
    for b in range(k // 32):
        scale = w.d.float()[:, b].unsqueeze(0) * dx[:, b].unsqueeze(1)  # float32 [m, n]
        out = _fma32(scale, sums[:, :, b], out)
        if w.m is not None:
            out = _fma32(w.m.float()[:, b].unsqueeze(0), xsum[:, b].unsqueeze(1), out)
    return out if bias is None else bias + out


def _fma32(a: torch.Tensor, b: torch.Tensor, c: torch.Tensor) -> torch.Tensor:
    return (a.double() * b.double() + c.double()).float()


def assert_within_an_ulp(got: torch.Tensor, want: torch.Tensor) -> None:
    ulp = torch.nextafter(want.abs(), torch.tensor(float("inf"))) - want.abs()
    assert ((got - want).abs() <= ulp).all(), (got - want).abs().max()


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


ROUNDED = {qgemm.INT8: 1e-4, qgemm.INT16: 1e-6}  # error, of scale, that shows the rounding


@pytest.mark.parametrize("activations", [qgemm.INT8, qgemm.INT16])
@pytest.mark.parametrize("kind", [Q4_1, Q8_0])
@pytest.mark.parametrize(("m", "n", "k"), [(1, 64, 32), (3, 40, 96), (8, 100, 64), (131, 17, 64)])
def test_integer_activations_compute_their_scheme_within_its_bound(
    kernel: qgemm.QuantGemm, kind: str, m: int, n: int, k: int, activations: str
) -> None:
    """The kernel's result is its scheme's (an input rounded the other way would be off by
    about 4e-4 (int8) or 1.5e-6 (int16) of scale here, tens of ulps), within the rounding
    bound of the exact products."""
    w = block_weight(kind, n, k, seed=m)
    x, b = torch.randn(m, k), torch.randn(n)
    got = kernel.matmul(x, pack(kernel, w, activations), b)
    assert_within_an_ulp(got, integer_reference(x, w, activations, b))
    scale = (x.abs().double() @ w.dequantize().abs().double().T).clamp_min(1.0)
    exact = x.double() @ w.dequantize().double().T + b.double()
    error = (got.double() - exact).abs()
    bound = qgemm.rounding_bound(x, w.dequantize(offset=False), activations).double()
    assert (error <= bound + 1e-5 * scale).all()
    assert error.max() > ROUNDED[activations] * scale.max()  # the activations really were rounded


@pytest.mark.parametrize("activations", [qgemm.INT8, qgemm.INT16])
@pytest.mark.parametrize("kind", [Q4_1, Q8_0])
def test_integer_sums_do_not_overflow_at_the_extremes(
    kernel: qgemm.QuantGemm, kind: str, activations: str
) -> None:
    """Every weight at its largest magnitude (15, or -128) and every input at max|x|: the
    partial sums are at their bounds (int8: 16-bit, 16 * 15 * 127 and 2 * 128 * 127; int16:
    a block's 32-bit sum, 32 * 15 * 32767 and 32 * 128 * 32767, about 2^24 and 2^27)."""
    n, k = 20, 64
    q = torch.full((n, k), 15 if kind == Q4_1 else -128)
    w = BlockWeight(
        kind,
        q.to(torch.uint8 if kind == Q4_1 else torch.int8),
        torch.full((n, k // 32), 0.5, dtype=torch.float16),
        torch.zeros(n, k // 32, dtype=torch.float16) if kind == Q4_1 else None,
    )
    x = torch.full((2, k), float(qgemm.LEVELS[activations]))  # dx = 1: every product exact
    x[1] = -x[1]
    got = kernel.matmul(x, pack(kernel, w, activations), None)
    assert torch.equal(got, integer_reference(x, w, activations))
    assert torch.equal(got.double(), x.double() @ w.dequantize().double().T)


@pytest.mark.parametrize("activations", qgemm.ACTIVATIONS)
@pytest.mark.parametrize("kind", [Q4_1, Q8_0])
def test_a_row_does_not_depend_on_batch_or_threads(
    kernel: qgemm.QuantGemm, kind: str, activations: str
) -> None:
    w = block_weight(kind, 3072, 576)
    packed, x = pack(kernel, w, activations), torch.randn(9, 576)
    alone = kernel.matmul(x[4:5], packed, None)
    before = torch.get_num_threads()
    try:
        for threads in (1, 2, 3):
            torch.set_num_threads(threads)
            assert torch.equal(kernel.matmul(x, packed, None)[4:5], alone)
    finally:
        torch.set_num_threads(before)


@pytest.mark.skipif(len(RUNNABLE) < 2, reason="needs a CPU that runs both builds")
@pytest.mark.parametrize("activations", qgemm.ACTIVATIONS)
@pytest.mark.parametrize("kind", [Q4_1, Q8_0])
def test_both_builds_give_the_same_bits(kind: str, activations: str) -> None:
    w, x = block_weight(kind, 200, 320), torch.randn(7, 320)
    wide, narrow = qgemm.load("avx512"), qgemm.load("avx2")
    assert wide is not None and narrow is not None
    got = wide.matmul(x, pack(wide, w, activations), None)
    assert torch.equal(got, narrow.matmul(x, pack(narrow, w, activations), None))


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


@pytest.mark.parametrize(
    ("activations", "kind"), [(qgemm.INT8, qgemm.Q4_1_INT8), (qgemm.INT16, qgemm.Q4_1_INT16)]
)
def test_linear_with_integer_activations_stays_within_the_rounding_bound(
    activations: str, kind: str
) -> None:
    if qgemm.load() is None:
        pytest.skip("no block GEMM on this machine")
    w, b, x = block_weight(Q4_1, 96, 64), torch.randn(96), torch.randn(2, 5, 64)
    layer = Linear(w, b, activations=activations)
    assert layer.blocks is not None and layer.blocks.kind == kind
    exact = torch.nn.functional.linear(x, w.dequantize(), b)
    bound = qgemm.rounding_bound(x.view(10, 64), w.dequantize(offset=False), activations)
    error = (layer(x) - exact).abs()
    assert (error <= bound.view(2, 5, 96) + 1e-4).all()
    assert error.max() > ROUNDED[activations]  # rounded (the outputs' scale is about 1)
    plain = Linear(w, b).blocks
    assert plain is not None and plain.kind == qgemm.Q4_1


def test_the_engine_config_names_its_weight_choices() -> None:
    assert EngineConfig(weights="blocks-int8").weights == "blocks-int8"
    assert EngineConfig(weights="blocks-int16").weights == "blocks-int16"
    with pytest.raises(ValueError, match="auto, blocks-int16, blocks-int8, dequantized"):
        EngineConfig(weights="int4")


@pytest.mark.parametrize("threads", [2, 3, 4])
def test_the_pool_runs_each_item_once_and_returns_after_the_last_part(
    kernel: qgemm.QuantGemm, threads: int
) -> None:
    """100,000 calls back to back whose part counts change from call to call, as a decode
    step's GEMMs and attention calls do: every item of a call ran exactly once and no part was
    still running when its call returned (a late part would read its caller's arguments from a
    stack frame that is gone). The pool before its ticket carried the part count failed this
    5-150 times per thread count."""
    probe = build.load_library(POOL_PROBE, kernel.isa, qgemm.ISA_FLAGS[kernel.isa])
    assert probe is not None, "the probe did not build"
    probe.kvgate_pool_probe.restype = ctypes.c_int64
    probe.kvgate_pool_probe.argtypes = [ctypes.c_void_p, ctypes.c_int64, ctypes.c_int]
    assert probe.kvgate_pool_probe(kernel.parallel_for, 100_000, threads) == 0
