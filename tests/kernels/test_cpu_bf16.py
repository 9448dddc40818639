"""bf16 linears on the CPU (``engine/runtime/model/linear.py``): oneDNN's packed linear on a CPU
with bf16 matrix units (AMX-BF16 or AVX512_BF16), torch's bf16 reference (``F.linear``)
elsewhere; either within bf16's rounding of the float32 product, and the same bits on any thread
count and for a row alone or in a batch.

The tests marked ``native`` run where the units exist and ``KVGATE_CPU_ISA`` leaves them on
(the first pass of ``make test`` on an AMX or Zen 4 host); elsewhere they are skipped, saying why.
"""

from __future__ import annotations

import itertools
from collections.abc import Iterator

import pytest
import torch
import torch.nn.functional as F

from engine.runtime import cpu_isa
from engine.runtime.model import linear
from engine.runtime.model.linear import BF16_ROUNDING, ONEDNN_MAX_K, Linear, k_slices, sliced

UNITS = cpu_isa.native_bf16()
native = pytest.mark.skipif(
    UNITS is None,
    reason="needs a CPU with AMX-BF16 or AVX512_BF16, not held to AVX2 by KVGATE_CPU_ISA "
    f"(this one: {cpu_isa.bf16_units(cpu_isa.cpu_flags()) or 'no bf16 units'}, "
    f"KVGATE_CPU_ISA={cpu_isa.requested()})",
)
# (in, out) of every linear of the reference geometry (Qwen2.5-0.5B): qkv, o, gate_up, down,
# and an 8000-row slice of its LM head
SHAPES = [(896, 1152), (896, 896), (896, 9728), (4864, 896), (896, 8000)]
ROWS = (1, 5, 16, 70)
THREADS = (1, 2, 3, 8)


@pytest.fixture
def restore_threads() -> Iterator[None]:
    before = torch.get_num_threads()
    yield
    torch.set_num_threads(before)


def _weight(out: int, k: int, seed: int = 0) -> torch.Tensor:
    gen = torch.Generator().manual_seed(seed)
    return (torch.randn(out, k, generator=gen) * k**-0.5).bfloat16()


def _within_bf16(got: torch.Tensor, x: torch.Tensor, w: torch.Tensor) -> None:
    """``got`` is the float32 product of the bf16 operands within two bf16 roundings of the
    terms' magnitude (its output rounding, or the rounding of each summed slice)."""
    want = F.linear(x.float(), w.float())
    scale = F.linear(x.float().abs(), w.float().abs())
    excess = (got.float() - want).abs() - (1e-5 + 2 * BF16_ROUNDING) * scale
    assert excess.max().item() <= 0, f"off by {excess.max().item():.3g} beyond bf16's rounding"


def test_slices_cover_the_input_and_stay_under_the_limit() -> None:
    for k in (1, 64, 896, ONEDNN_MAX_K, ONEDNN_MAX_K + 1, 4864, 9728, 18944):
        slices = k_slices(k)
        assert slices[0][0] == 0 and slices[-1][1] == k
        assert all(a[1] == b[0] for a, b in itertools.pairwise(slices))
        assert all(0 < hi - lo <= ONEDNN_MAX_K for lo, hi in slices)
        assert all(lo % linear.K_ALIGN == 0 for lo, _ in slices)
        assert len(slices) == -(-k // ONEDNN_MAX_K)
    assert k_slices(4864) == [(0, 2432), (2432, 4864)]


def test_a_sliced_linear_sums_its_slices_in_float32_in_order() -> None:
    """The slicing itself, on any CPU: each slice by ``F.linear`` (as the oneDNN calls would),
    the bias added once, the sum in slice order."""
    w, bias = _weight(96, 4864), _weight(1, 96, seed=1)[0]
    x = _weight(5, 4864, seed=2)

    def make(part: torch.Tensor, b: torch.Tensor | None) -> linear.MatMul:
        return lambda rows: F.linear(rows, part, b)

    fn = sliced(w, bias, make)
    assert fn is not None
    got = fn(x)
    assert got.dtype == torch.float32
    (lo0, hi0), (lo1, hi1) = k_slices(4864)
    first = F.linear(x[:, lo0:hi0], w[:, lo0:hi0], bias).float()
    assert torch.equal(got, first + F.linear(x[:, lo1:hi1], w[:, lo1:hi1]).float())
    _within_bf16(got - bias.float(), x, w)
    assert sliced(w, bias, lambda part, b: None) is None  # a slice without a path: no path


def test_a_bf16_linear_follows_its_input_dtype_and_stays_within_bf16_rounding() -> None:
    w = _weight(1152, 896)
    lin = Linear(w)
    assert lin.dtype == torch.bfloat16
    assert (lin.matmul is not None) == (UNITS is not None)  # packed exactly on bf16 units
    x = torch.randn(7, 896, generator=torch.Generator().manual_seed(3))
    y32 = lin(x)  # float32 activations: cast to bf16 for the product, the output back
    assert y32.dtype == torch.float32 and y32.shape == (7, 1152)
    y16 = lin(x.bfloat16())
    assert y16.dtype == torch.bfloat16
    _within_bf16(y32, x.bfloat16(), w)
    assert lin(x[:0]).shape == (0, 1152)


@pytest.mark.parametrize(("k", "out"), SHAPES)
def test_the_bf16_path_gives_the_same_bits_on_any_thread_count(
    k: int, out: int, restore_threads: None
) -> None:
    """On this CPU's path (oneDNN on bf16 units, else the reference): every thread count gives
    the same bits. The reference also gives a row the same bits alone or inside a batch; oneDNN
    may pick other kernels for other row counts (held within bf16's tolerance: test_bf16.py)."""
    lin = Linear(_weight(out, k))
    x = torch.randn(max(ROWS), k, generator=torch.Generator().manual_seed(4)).bfloat16()
    torch.set_num_threads(1)
    want = {m: lin(x[:m]) for m in ROWS}
    for m in ROWS:
        alone = torch.equal(want[m][:1], want[1])
        assert alone or UNITS is not None, f"row 0 of {m} rows differs from it alone"
    for threads in THREADS:
        torch.set_num_threads(threads)
        for m in ROWS:
            got = lin(x[:m])
            assert torch.equal(got, want[m]), f"{m} rows on {threads} threads: other bits"


@native
@pytest.mark.parametrize(("k", "out"), SHAPES)
def test_on_bf16_units_every_linear_takes_onednn_within_bf16_rounding(k: int, out: int) -> None:
    w = _weight(out, k)
    lin = Linear(w)
    assert lin.matmul is not None and lin.weight is None  # packed; the plain weight dropped
    x = torch.randn(64, k, generator=torch.Generator().manual_seed(5)).bfloat16()
    _within_bf16(lin(x), x, w)


@native
def test_a_long_reduction_is_split_where_onednn_would_split_it_by_threads() -> None:
    """The down projection (4864 inputs) runs as two oneDNN calls of 2432, summed in float32:
    the output is float32 before the cast back, which a single oneDNN call never gives."""
    w = _weight(896, 4864)
    fn = linear._onednn_bf16(w, None)
    assert fn is not None
    x = torch.randn(3, 4864, generator=torch.Generator().manual_seed(6)).bfloat16()
    assert fn(x).dtype == torch.float32
    single = linear._onednn(w, None)
    assert single is not None and single(x).dtype == torch.bfloat16
