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

A packed layout replaces the plain weight, which is then dropped. Other devices and dtypes use
``F.linear``.
"""

from __future__ import annotations

from collections.abc import Callable

import torch
import torch.nn.functional as F

from engine.runtime.kernels.cpu import gemm, qgemm
from engine.runtime.model.blocks import BlockWeight

PROBE_OUTPUTS = 64  # outputs of a block weight checked against its dequantized rows
PACK_ROWS_HINT = 8  # the row count oneDNN tunes its blocked layout for (a typical decode batch)

MatMul = Callable[[torch.Tensor], torch.Tensor]  # x [m, in] -> [m, out]


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
    ``qgemm.rounding_bound``)."""
    probe = torch.randn(3, weight.shape[1], generator=torch.Generator().manual_seed(0))
    try:
        got = fn(probe)[:, :outputs]
    except RuntimeError:
        return False
    want = F.linear(probe, weight, None if bias is None else bias[:outputs])
    # float32 rounding of a K-term dot product grows with the magnitude of its terms
    scale = F.linear(probe.abs(), weight.abs()).clamp_min(1.0)
    allowed = 1e-5 * scale
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
    for make in (_panel_gemm, _onednn):
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
        if plain is not None and plain.device.type == "cpu" and plain.dtype == torch.float32:
            self.matmul = _cpu_matmul(plain, bias)
        # [out, in]; only kept where it is the layout used
        self.weight: torch.Tensor | None = plain if self.matmul is None else None

    def __call__(self, x: torch.Tensor) -> torch.Tensor:
        if self.matmul is None:
            assert self.weight is not None  # kept exactly when there is no packed path
            return F.linear(x, self.weight, self.bias)
        rows = x.numel() // self.in_features
        if rows == 0:
            return x.new_empty(*x.shape[:-1], self.out_features)
        y = self.matmul(x.reshape(rows, self.in_features))
        return y.view(*x.shape[:-1], self.out_features)
