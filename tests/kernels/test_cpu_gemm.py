"""The packed-panel CPU GEMM, each ISA build this CPU runs: exact shapes, tails, bias, batch
invariance, threads; and the fallbacks when it cannot be built or is turned off."""

from __future__ import annotations

import dataclasses
import logging

import pytest
import torch
import torch.nn.functional as F

from engine.runtime.kernels.cpu import gemm
from engine.runtime.model.linear import Linear

RUNNABLE = {"AVX512": ["avx512", "avx2"], "AVX2": ["avx2"]}.get(
    torch.backends.cpu.get_cpu_capability(), []
)


@pytest.fixture(params=["avx512", "avx2"])
def kernel(request: pytest.FixtureRequest) -> gemm.PanelGemm:
    if request.param not in RUNNABLE:
        pytest.skip(f"this CPU cannot run the {request.param} build")
    built = gemm.load(request.param)
    if built is None:
        pytest.skip("no C compiler")
    return built


def _case(m: int, n: int, k: int, bias: bool, seed: int = 0):
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(m, k, generator=g)
    w = torch.randn(n, k, generator=g) * 0.05
    b = torch.randn(n, generator=g) if bias else None
    return x, w, b


def test_panel_width_follows_the_vector_width(kernel: gemm.PanelGemm) -> None:
    assert kernel.panel == {"avx512": 32, "avx2": 16}[kernel.isa]


@pytest.mark.parametrize(
    ("m", "n", "k"),
    [
        (1, 32, 16),  # whole panels only
        (3, 37, 19),  # a partial last panel
        (8, 24, 64),  # a panel of 8 (avx2: whole; avx512: half)
        (9, 100, 600),  # a second row group; k past one 512 block
        (17, 200, 1030),  # several row groups; k over two blocks and a tail
        (130, 70, 96),  # a second block of 128 rows
    ],
)
@pytest.mark.parametrize("bias", [False, True])
def test_matches_float64_reference(
    kernel: gemm.PanelGemm, m: int, n: int, k: int, bias: bool
) -> None:
    x, w, b = _case(m, n, k, bias)
    got = kernel.matmul(x, kernel.pack(w), n, b)
    b64 = None if b is None else b.double()
    want = F.linear(x.double(), w.double(), b64)
    assert got.shape == (m, n) and got.dtype == torch.float32
    scale = F.linear(x.abs().double(), w.abs().double()).clamp_min(1.0)
    assert ((got.double() - want).abs() <= 2e-6 * scale).all()


@pytest.mark.skipif(RUNNABLE != ["avx512", "avx2"], reason="needs a CPU that runs both builds")
def test_both_builds_agree_with_torch_and_with_each_other() -> None:
    x, w, b = _case(13, 300, 1030, bias=True, seed=6)  # two row groups, a partial panel
    want = F.linear(x, w, b)
    scale = F.linear(x.abs(), w.abs()).clamp_min(1.0)
    got = {}
    for isa in RUNNABLE:
        kernel = gemm.load(isa)
        if kernel is None:
            pytest.skip("no C compiler")
        got[isa] = kernel.matmul(x, kernel.pack(w), 300, b)
        assert ((got[isa] - want).abs() <= 1e-5 * scale).all(), isa
    # A vector lane is an output column: each output is the same chain of multiply-adds over k
    # on either vector width, so the builds agree bit for bit.
    assert torch.equal(got["avx512"], got["avx2"])


def test_a_row_does_not_depend_on_its_batch(kernel: gemm.PanelGemm) -> None:
    x, w, b = _case(140, 75, 700, bias=True, seed=1)
    packed = kernel.pack(w)
    full = kernel.matmul(x, packed, 75, b)
    for lo, hi in [(0, 1), (5, 6), (3, 11), (7, 16), (100, 140), (0, 129)]:
        assert torch.equal(kernel.matmul(x[lo:hi], packed, 75, b), full[lo:hi]), (lo, hi)


def test_threads_split_panels_with_identical_results(kernel: gemm.PanelGemm) -> None:
    x, w, b = _case(12, 4000, 896, bias=True, seed=2)
    packed = kernel.pack(w)
    before = torch.get_num_threads()
    try:
        torch.set_num_threads(1)
        one = kernel.matmul(x, packed, 4000, b)
        torch.set_num_threads(3)
        three = kernel.matmul(x, packed, 4000, b)
    finally:
        torch.set_num_threads(before)
    assert torch.equal(one, three)


def test_wrong_inner_size_is_refused(kernel: gemm.PanelGemm) -> None:
    x, w, _ = _case(2, 40, 24, bias=False)
    with pytest.raises(ValueError, match="24 columns"):
        kernel.matmul(x, kernel.pack(w[:, :16]), 40, None)


def test_linear_uses_the_panel_gemm_and_drops_the_plain_weight() -> None:
    kernel = gemm.load()
    if kernel is None:
        pytest.skip("no panel GEMM on this machine")
    x, w, b = _case(5, 64, 32, bias=True, seed=3)
    layer = Linear(w, b)
    assert layer.weight is None
    want = kernel.matmul(x, kernel.pack(w), 64, b)
    assert torch.equal(layer(x.view(1, 5, 32)).view(5, 64), want)
    assert layer(x[:0]).shape == (0, 64)


def test_turned_off_by_environment(monkeypatch: pytest.MonkeyPatch, fresh_build) -> None:
    monkeypatch.setenv("KVGATE_CPU_GEMM", "0")
    assert gemm.load() is None
    x, w, b = _case(4, 40, 24, bias=True)
    layer = Linear(w, b)  # falls back to oneDNN or F.linear, same answer
    assert torch.allclose(layer(x), F.linear(x, w, b), atol=1e-5)


@pytest.mark.skipif("avx2" not in RUNNABLE, reason="needs an x86 CPU with AVX2")
def test_environment_picks_the_avx2_build(monkeypatch: pytest.MonkeyPatch, fresh_build) -> None:
    monkeypatch.setenv("KVGATE_CPU_GEMM", "avx2")
    kernel = gemm.load()
    if kernel is None:
        pytest.skip("no C compiler")
    assert kernel.isa == "avx2"
    assert [p.name.split("-")[1] for p in (fresh_build / "kernels").iterdir()] == ["avx2"]


@pytest.mark.skipif(not RUNNABLE, reason="needs an x86 CPU with AVX2 or AVX-512")
def test_failed_build_falls_back_with_a_warning(
    monkeypatch: pytest.MonkeyPatch, fresh_build, caplog: pytest.LogCaptureFixture
) -> None:
    monkeypatch.setenv("CC", "false")  # a "compiler" that always fails
    with caplog.at_level(logging.WARNING, logger=gemm.__name__):
        assert gemm.load() is None
    assert "fall back" in caplog.text


def _bad_inputs(kernel: gemm.PanelGemm):
    x, w, b = _case(3, 40, 24, bias=True, seed=4)
    packed = kernel.pack(w)
    yield "float64 x", (x.double(), packed, 40, b), "float32"
    yield "float64 bias", (x, packed, 40, b.double()), "float32"
    yield "wrong K", (torch.randn(3, 16), packed, 40, b), "16 columns"
    yield "1-D x", (x[0], packed, 40, b), r"\[m, k\]"
    yield "non-contiguous packed", (x, packed.transpose(0, 1), 40, b), "24 columns|contiguous"
    yield "packed of float64", (x, packed.double(), 40, b), "float32"
    yield "short bias", (x, packed, 40, b[:39]), r"bias must be a contiguous \[40\]"
    yield "strided bias", (x, packed, 40, torch.randn(80)[::2]), "contiguous"
    yield "n past the panels", (x, packed, 40 + kernel.panel * 2, None), "panels"
    yield "n of zero", (x, packed, 0, None), "panels"


def test_bad_arguments_are_refused_before_the_call_into_c(kernel: gemm.PanelGemm) -> None:
    calls: list[tuple] = []
    probe = dataclasses.replace(kernel, lib=_RecordingLib(calls))
    for name, (x, packed, n, bias), message in _bad_inputs(kernel):
        with pytest.raises(ValueError, match=message):
            probe.matmul(x, packed, n, bias)
        assert calls == [], name
    x, w, b = _case(3, 40, 24, bias=True, seed=4)
    probe.matmul(x, kernel.pack(w), 40, b)  # the probe does record a valid call
    assert len(calls) == 1


class _RecordingLib:
    """Stands in for the C library: records calls instead of running them."""

    def __init__(self, calls: list[tuple]) -> None:
        self.kvgate_gemm = lambda *args: calls.append(args)


def test_a_non_contiguous_x_is_copied_not_misread(kernel: gemm.PanelGemm) -> None:
    x, w, b = _case(6, 40, 48, bias=True, seed=5)
    strided = x[:, ::2]  # [6, 24] with a column stride of 2
    assert not strided.is_contiguous()
    packed = kernel.pack(w[:, :24])
    got = kernel.matmul(strided, packed, 40, b)
    assert torch.equal(got, kernel.matmul(strided.contiguous(), packed, 40, b))
