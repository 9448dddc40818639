"""``y = x @ W.T + b``, laid out for the device it runs on.

CPU, float32, in order of preference, each checked once against ``F.linear`` on a probe:

- a weight kept in a GGUF block format (``blocks.py``): kvgate's block GEMM
  (``engine/runtime/kernels/cpu/qgemm.py``), which reads the blocks as stored, with float32
  activations or (``activations`` int16 / int8) activations rounded per block of 32, checked
  within that rounding's bound; where it cannot run, the weight is dequantized and takes the
  float32 paths below;
- x86 with AVX-512 or AVX2: kvgate's packed-panel GEMM (``engine/runtime/kernels/cpu/gemm.py``);
- oneDNN's prepacked linear (the one torch's CPU compiler uses);
- ``F.linear``, which goes through MKL's transposed-B path: slower at every row count measured
  (oneDNN was 1.3-2x faster up to 128 rows, 1.1-1.2x above, 2.5x for the LM head at 8 rows).

CPU, bfloat16, where the CPU has bf16 matrix units (``cpu_isa.native_bf16``: AMX-BF16 or
AVX512_BF16): oneDNN's prepacked linear on those units (AMX tiles, or ``vdpbf16ps``), float32
accumulation, checked against ``F.linear`` on a probe within bf16's rounding. Without the units
(or under ``KVGATE_CPU_ISA=avx2``) a bf16 weight takes ``F.linear``: torch's bf16 reference,
correct but slow. Why oneDNN and not a kernel of kvgate's own: on a CPU with AMX its tiles
multiply 1024 bf16 FLOP per cycle and core against 128 for the best ``vdpbf16ps`` loop, and
oneDNN is the library that drives them (torch's and vLLM's CPU paths use it too); on
AVX512_BF16 alone both would run the same instruction.

The same bits on any thread count: oneDNN's inner product splits a long reduction across
threads only for bf16 on AMX, only where the input has more than 4096 features and the rest of
the work spreads badly over the threads (``use_parallel_ic_reduction_for_bf16`` in its
``jit_brgemm_inner_product_utils.cpp``); the split moves with the thread count and so do the
bits. So a bf16 weight with more than ``ONEDNN_MAX_K`` input features is packed as column
slices of at most that many, each one oneDNN call, whose outputs are added in float32 in slice
order (``tests/kernels/test_cpu_bf16.py`` checks the bits over thread counts where the units
exist).

A linear computes in its weight's dtype: an input in another dtype (the CPU's float32
activations beside bf16 weights: ``engine/runtime/device.py``) is cast to it, and the output
back. A packed layout replaces the plain weight, which is then dropped. Other devices and
dtypes use ``F.linear``.
"""

from __future__ import annotations

from collections.abc import Callable

import torch
import torch.nn.functional as F

from engine.runtime import cpu_isa
from engine.runtime.kernels.cpu import gemm, qgemm
from engine.runtime.model.blocks import BlockWeight

PROBE_OUTPUTS = 64  # outputs of a block weight checked against its dequantized rows
PACK_ROWS_HINT = 8  # the row count oneDNN tunes its blocked layout for (a typical decode batch)
# the most input features of one oneDNN bf16 call: above 4096 oneDNN may split the reduction
# across threads (see the module docstring); a multiple of 64 (AMX's K tile is 32 bf16 pairs)
ONEDNN_MAX_K = 4096
K_ALIGN = 64
BF16_ROUNDING = 2.0**-8  # bf16's unit roundoff (8 significant bits): its output's relative error

MatMul = Callable[[torch.Tensor], torch.Tensor]  # x [m, in] -> [m, out]
MakeMatMul = Callable[[torch.Tensor, torch.Tensor | None], MatMul | None]  # (weight, bias) -> path


def _agrees(
    fn: MatMul,
    weight: torch.Tensor,
    bias: torch.Tensor | None,
    outputs: int | None = None,
    rounded: torch.Tensor | None = None,
    activations: str = qgemm.FLOAT32,
) -> bool:
    """``fn`` gives ``F.linear``'s answer on a probe (its first ``outputs`` columns, when given:
    ``weight`` holds only those rows); where ``fn`` rounds its input to ``activations``, within
    that rounding's bound more (``rounded``: the weight's part that meets the rounded input,
    ``qgemm.rounding_bound``). A probe of a bf16 weight is bf16, and both sides round their
    output to bf16 (or add slices rounded so): within two of its roundings."""
    gen = torch.Generator().manual_seed(0)
    probe = torch.randn(3, weight.shape[1], generator=gen).to(weight.dtype)
    try:
        got = fn(probe)[:, :outputs].float()
    except RuntimeError:
        return False
    want = F.linear(probe, weight, None if bias is None else bias[:outputs]).float()
    # float32 rounding of a K-term dot product grows with the magnitude of its terms
    scale = F.linear(probe.abs(), weight.abs()).float().clamp_min(1.0)
    relative = 1e-5 if weight.dtype == torch.float32 else 1e-5 + 2 * BF16_ROUNDING
    allowed = relative * scale
    if rounded is not None:
        allowed = allowed + qgemm.rounding_bound(probe, rounded, activations)
    return bool(((got - want).abs() <= allowed).all())


def _panel_gemm(weight: torch.Tensor, bias: torch.Tensor | None) -> MatMul | None:
    kernel = gemm.load()
    if kernel is None:
        return None
    packed, n = kernel.pack(weight), weight.shape[0]
    bias = None if bias is None else bias.contiguous()
    return lambda x: kernel.matmul(x, packed, n, bias)


def _onednn(weight: torch.Tensor, bias: torch.Tensor | None) -> MatMul | None:
    ops = torch.ops.mkldnn
    if not (torch.backends.mkldnn.is_available() and hasattr(ops, "_linear_pointwise")):
        return None
    try:
        packed = ops._reorder_linear_weight(weight, PACK_ROWS_HINT)
    except RuntimeError:
        return None
    return lambda x: ops._linear_pointwise(x, packed, bias, "none", [], "")


def k_slices(k: int) -> list[tuple[int, int]]:
    """[start, end) column slices of a ``k``-feature input, each at most ``ONEDNN_MAX_K`` wide,
    as even as ``K_ALIGN`` allows (one slice where ``k`` fits)."""
    count = -(-k // ONEDNN_MAX_K)
    width = -(-k // count // K_ALIGN) * K_ALIGN
    return [(start, min(start + width, k)) for start in range(0, k, width)]


def sliced(
    weight: torch.Tensor,
    bias: torch.Tensor | None,
    make: MakeMatMul,
) -> MatMul | None:
    """``make``'s matmul of ``weight``, one per ``k_slices`` slice of its input features, their
    outputs summed in float32 in slice order (the bias with the first); ``make``'s own where
    one slice holds them all. None where ``make`` gives None for a slice."""
    slices = k_slices(weight.shape[1])
    if len(slices) == 1:
        return make(weight, bias)
    parts = []
    for i, (lo, hi) in enumerate(slices):
        part = make(weight[:, lo:hi].contiguous(), bias if i == 0 else None)
        if part is None:
            return None
        parts.append((lo, hi, part))

    def fn(x: torch.Tensor) -> torch.Tensor:
        total: torch.Tensor | None = None
        for lo, hi, part in parts:
            y = part(x[:, lo:hi].contiguous()).float()
            total = y if total is None else total.add_(y)
        assert total is not None  # at least two slices
        return total

    return fn


def _onednn_bf16(weight: torch.Tensor, bias: torch.Tensor | None) -> MatMul | None:
    """oneDNN's packed bf16 linear, sliced so that no call reduces over more than
    ``ONEDNN_MAX_K`` features (the same bits on any thread count: module docstring)."""
    return sliced(weight, bias, _onednn)


def _block_matmul(
    weight: BlockWeight, bias: torch.Tensor | None, activations: str
) -> tuple[MatMul, qgemm.PackedBlocks] | None:
    kernel = qgemm.load()
    if kernel is None or weight.device.type != "cpu":
        return None
    if weight.m is None:
        packed = kernel.pack_q8_0(weight.q, weight.d, activations=activations)
    else:
        packed = kernel.pack_q4_1(weight.q, weight.d, weight.m, activations=activations)
    bias = None if bias is None else bias.contiguous()

    def fn(x: torch.Tensor) -> torch.Tensor:
        return kernel.matmul(x, packed, bias)

    probe_rows = torch.arange(min(PROBE_OUTPUTS, weight.shape[0]))
    integer = activations != qgemm.FLOAT32
    rounded = weight.dequantize(probe_rows, offset=False) if integer else None
    plain = weight.dequantize(probe_rows)
    agrees = _agrees(fn, plain, bias, len(probe_rows), rounded, activations)
    return (fn, packed) if agrees else None


def _cpu_matmul(weight: torch.Tensor, bias: torch.Tensor | None) -> MatMul | None:
    """The packed CPU path of a plain weight, or None (``F.linear`` then)."""
    makes: tuple[MakeMatMul, ...]
    if weight.dtype == torch.float32:
        makes = (_panel_gemm, _onednn)
    elif weight.dtype == torch.bfloat16 and cpu_isa.native_bf16() is not None:
        makes = (_onednn_bf16,)
    else:
        return None
    for make in makes:
        fn = make(weight, bias)
        if fn is not None and _agrees(fn, weight, bias):
            return fn
    return None


class Linear:
    def __init__(
        self,
        weight: torch.Tensor | BlockWeight,
        bias: torch.Tensor | None = None,
        *,
        activations: str = qgemm.FLOAT32,
    ) -> None:
        """``activations``: the precision a weight in blocks meets its input in
        (``qgemm.ACTIVATIONS``; the kernel of that precision)."""
        self.out_features, self.in_features = weight.shape
        self.bias = bias
        self.matmul: MatMul | None = None  # a packed CPU path
        # the block GEMM's packed weight, where that is the path (the fused CPU layers read it)
        self.blocks: qgemm.PackedBlocks | None = None
        if isinstance(weight, BlockWeight):
            block = _block_matmul(weight, bias, activations)
            if block is not None:
                self.matmul, self.blocks = block
                self.bias = None if bias is None else bias.contiguous()
            plain = None if block else weight.dequantize()
        else:
            plain = weight
        # the dtype this linear computes in (a weight in blocks meets float32 or rounded input)
        self.dtype = torch.float32 if plain is None else plain.dtype
        if plain is not None and plain.device.type == "cpu":
            self.matmul = _cpu_matmul(plain, bias)
        # [out, in]; only kept where it is the layout used
        self.weight: torch.Tensor | None = plain if self.matmul is None else None

    def __call__(self, x: torch.Tensor) -> torch.Tensor:
        """``x`` [..., in] -> [..., out] in ``x``'s dtype, computed in ``self.dtype``."""
        given = x.dtype
        if given != self.dtype:
            x = x.to(self.dtype)
        if self.matmul is None:
            assert self.weight is not None  # kept exactly when there is no packed path
            y = F.linear(x, self.weight, self.bias)
        else:
            rows = x.numel() // self.in_features
            if rows == 0:
                return x.new_empty(*x.shape[:-1], self.out_features, dtype=given)
            y = self.matmul(x.reshape(rows, self.in_features))
            y = y.view(*x.shape[:-1], self.out_features)
        return y if y.dtype == given else y.to(given)
