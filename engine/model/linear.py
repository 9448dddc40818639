"""``y = x @ W.T + b``, laid out for the device it runs on.

CPU, float32: matmuls with few rows (decoding: one row per request) use a copy of the weight
reordered into oneDNN's blocked layout (the prepacked linear of torch's CPU compiler). There the
plain ``F.linear`` goes through MKL's transposed-B path, which is slow: the LM head at 8 rows runs
about 2x faster prepacked on x86. Many rows (prefill) keep ``F.linear``, which is as fast or faster
there. The packed copy is checked against ``F.linear`` on a probe and skipped where oneDNN is
unavailable. Other devices and dtypes use ``F.linear`` only.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

PACK_ROWS_HINT = 8  # the row count oneDNN tunes its blocked layout for (a typical decode batch)
PACKED_MAX_ROWS = 64  # above this, F.linear (MKL) is used


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
        self.weight = weight  # [out, in]
        self.bias = bias
        self.packed: torch.Tensor | None = None  # oneDNN layout, CPU float32 only
        if weight.device.type == "cpu" and weight.dtype == torch.float32:
            self.packed = _onednn_pack(weight, bias)

    def __call__(self, x: torch.Tensor) -> torch.Tensor:
        rows = x.numel() // self.in_features
        if self.packed is None or not 0 < rows <= PACKED_MAX_ROWS:
            return F.linear(x, self.weight, self.bias)
        x2 = x.reshape(rows, self.in_features)
        y = torch.ops.mkldnn._linear_pointwise(x2, self.packed, self.bias, "none", [], "")
        return y.view(*x.shape[:-1], self.out_features)
