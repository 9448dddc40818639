"""The packed-panel CPU GEMM: exact shapes, tails, bias, batch invariance, threads, fallbacks."""

from __future__ import annotations

import logging

import pytest
import torch
import torch.nn.functional as F

from engine.kernels.cpu import gemm
from engine.model.linear import Linear

needs_gemm = pytest.mark.skipif(not gemm.available(), reason="needs x86 AVX-512 and a C compiler")


def _case(m: int, n: int, k: int, bias: bool, seed: int = 0):
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(m, k, generator=g)
    w = torch.randn(n, k, generator=g) * 0.05
    b = torch.randn(n, generator=g) if bias else None
    return x, w, b


def _reference(x: torch.Tensor, w: torch.Tensor, b: torch.Tensor | None) -> torch.Tensor:
    b64 = None if b is None else b.double()
    return F.linear(x.double(), w.double(), b64)


@needs_gemm
@pytest.mark.parametrize(
    ("m", "n", "k"),
    [
        (1, 32, 16),  # one full panel
        (3, 37, 19),  # tail panel of 5 columns
        (8, 48, 64),  # tail panel of 16: the high half empty
        (9, 100, 600),  # a second row group; k past one 512 block
        (17, 200, 1030),  # three row groups; k over two blocks and a tail
        (130, 70, 96),  # a second block of 128 rows
    ],
)
@pytest.mark.parametrize("bias", [False, True])
def test_matches_float64_reference(m: int, n: int, k: int, bias: bool) -> None:
    x, w, b = _case(m, n, k, bias)
    got = gemm.matmul(x, gemm.pack(w), n, b)
    want = _reference(x, w, b)
    assert got.shape == (m, n) and got.dtype == torch.float32
    scale = F.linear(x.abs().double(), w.abs().double()).clamp_min(1.0)
    assert ((got.double() - want).abs() <= 2e-6 * scale).all()


@needs_gemm
def test_a_row_does_not_depend_on_its_batch() -> None:
    x, w, b = _case(140, 75, 700, bias=True, seed=1)
    packed = gemm.pack(w)
    full = gemm.matmul(x, packed, 75, b)
    for lo, hi in [(0, 1), (5, 6), (3, 11), (7, 16), (100, 140), (0, 129)]:
        assert torch.equal(gemm.matmul(x[lo:hi], packed, 75, b), full[lo:hi]), (lo, hi)


@needs_gemm
def test_threads_split_panels_with_identical_results() -> None:
    x, w, b = _case(12, 4000, 896, bias=True, seed=2)
    packed = gemm.pack(w)
    before = torch.get_num_threads()
    try:
        torch.set_num_threads(1)
        one = gemm.matmul(x, packed, 4000, b)
        torch.set_num_threads(3)
        three = gemm.matmul(x, packed, 4000, b)
    finally:
        torch.set_num_threads(before)
    assert torch.equal(one, three)


@needs_gemm
def test_wrong_inner_size_is_refused() -> None:
    x, w, _ = _case(2, 40, 24, bias=False)
    with pytest.raises(ValueError, match="24 columns"):
        gemm.matmul(x, gemm.pack(w[:, :16]), 40, None)


@needs_gemm
def test_linear_uses_the_panel_gemm_and_drops_the_plain_weight() -> None:
    x, w, b = _case(5, 64, 32, bias=True, seed=3)
    layer = Linear(w, b)
    assert layer.weight is None
    assert torch.equal(layer(x.view(1, 5, 32)).view(5, 64), gemm.matmul(x, gemm.pack(w), 64, b))
    assert layer(x[:0]).shape == (0, 64)


@pytest.fixture
def fresh_library(monkeypatch: pytest.MonkeyPatch, tmp_path):
    monkeypatch.setenv("KVGATE_CACHE_DIR", str(tmp_path))
    gemm._library.cache_clear()
    yield
    monkeypatch.undo()
    gemm._library.cache_clear()


def test_disabled_by_environment(monkeypatch: pytest.MonkeyPatch, fresh_library) -> None:
    monkeypatch.setenv("KVGATE_CPU_GEMM", "0")
    assert not gemm.available()
    x, w, b = _case(4, 40, 24, bias=True)
    layer = Linear(w, b)  # falls back to oneDNN or F.linear, same answer
    assert torch.allclose(layer(x), F.linear(x, w, b), atol=1e-5)


@needs_gemm
def test_failed_build_falls_back_with_a_warning(
    monkeypatch: pytest.MonkeyPatch, fresh_library, caplog: pytest.LogCaptureFixture
) -> None:
    monkeypatch.setenv("CC", "false")  # a "compiler" that always fails
    with caplog.at_level(logging.WARNING, logger=gemm.__name__):
        assert not gemm.available()
    assert "fall back" in caplog.text


@needs_gemm
def test_builds_into_the_cache_directory(fresh_library, tmp_path) -> None:
    assert gemm.available()
    assert [p.name.startswith("gemm-") for p in (tmp_path / "kernels").iterdir()] == [True]
