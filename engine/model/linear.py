"""``y = x @ W.T + b``, laid out for the device it runs on.

CPU, float32: the weight is reordered once into oneDNN's blocked layout (the prepacked linear
that torch's CPU compiler uses). For the few-row matmuls of decoding (one row per request) the
plain ``F.linear`` goes through MKL's transposed-B path, which is slow there: the LM head at 8 rows
runs about 2x faster prepacked on x86; for many rows (prefill) the two are on par. Where oneDNN
is unavailable, or its result disagrees with ``torch.mm`` on a probe, a contiguous ``[in, out]``
copy and ``torch.mm`` are used. Other devices/dtypes keep the HF layout and ``F.linear``.
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
    return packed if torch.allclose(got, want, rtol=1e-4, atol=1e-5) else None


class Linear:
    def __init__(self, weight: torch.Tensor, bias: torch.Tensor | None = None) -> None:
        self.out_features, self.in_features = weight.shape
        self.bias = bias
        self.mode = "linear"
        self.weight = weight  # [out, in] for F.linear
        if weight.device.type == "cpu" and weight.dtype == torch.float32:
            packed = _onednn_pack(weight, bias)
            if packed is not None:
                self.mode, self.weight = "onednn", packed
            else:
                self.mode, self.weight = "mm", weight.t().contiguous()  # [in, out]

    def __call__(self, x: torch.Tensor) -> torch.Tensor:
        if self.mode == "linear":
            return F.linear(x, self.weight, self.bias)
        x2 = x.reshape(-1, self.in_features)
        if x2.shape[0] == 0:
            y = x2.new_empty((0, self.out_features))
        elif self.mode == "onednn":
            y = torch.ops.mkldnn._linear_pointwise(x2, self.weight, self.bias, "none", [], "")
        elif self.bias is None:
            y = torch.mm(x2, self.weight)
        else:
            y = torch.addmm(self.bias, x2, self.weight)
        return y.view(*x.shape[:-1], self.out_features)
