"""``y = x @ W.T + b``, laid out for the device it runs on.

CPU, float32: the weight is reordered once into oneDNN's blocked layout (the prepacked linear of
torch's CPU compiler) and the plain copy is dropped. ``F.linear`` goes through MKL's
transposed-B path instead, which measured slower at every row count on x86 with one thread
(``x`` rows 1..2688 over the Qwen2.5-0.5B layer shapes: 1.3-2x up to 128 rows, 1.1-1.2x above;
the LM head at 8 rows about 2.5x). The packed copy is checked against ``F.linear`` on a
probe and skipped where oneDNN is unavailable. Other devices and dtypes use ``F.linear``.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

PACK_ROWS_HINT = 8  # the row count oneDNN tunes its blocked layout for (a typical decode batch)


def _onednn_pack(weight: torch.Tensor, bias: torch.Tensor | None) -> torch.Tensor | None:
    ops = torch.ops.mkldnn
    if not (torch.backends.mkldnn.is_available() and hasattr(ops, "_linear_pointwise")):
        return None
    try:
        packed = ops._reorder_linear_weight(weight, PACK_ROWS_HINT)
        probe = torch.randn(3, weight.shape[1], generator=torch.Generator().manual_seed(0))
        got = ops._linear_pointwise(probe, packed, bias, "none", [], "")
    except RuntimeError:
        return None
    want = F.linear(probe, weight, bias)
    # float32 rounding of a K-term dot product grows with the magnitude of its terms
    scale = F.linear(probe.abs(), weight.abs()).clamp_min(1.0)
    return packed if bool(((got - want).abs() <= 1e-5 * scale).all()) else None


class Linear:
    def __init__(self, weight: torch.Tensor, bias: torch.Tensor | None = None) -> None:
        self.out_features, self.in_features = weight.shape
        self.bias = bias
        self.packed: torch.Tensor | None = None  # oneDNN layout, CPU float32 only
        if weight.device.type == "cpu" and weight.dtype == torch.float32:
            self.packed = _onednn_pack(weight, bias)
        # [out, in]; only kept where it is the layout used
        self.weight: torch.Tensor | None = weight if self.packed is None else None

    def __call__(self, x: torch.Tensor) -> torch.Tensor:
        if self.packed is None:
            return F.linear(x, self.weight, self.bias)
        rows = x.numel() // self.in_features
        if rows == 0:
            return x.new_empty(*x.shape[:-1], self.out_features)
        x2 = x.reshape(rows, self.in_features)
        y = torch.ops.mkldnn._linear_pointwise(x2, self.packed, self.bias, "none", [], "")
        return y.view(*x.shape[:-1], self.out_features)
