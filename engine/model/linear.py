"""``y = x @ W.T + b`` with MKL-packed weights on the CPU.

Decode matmuls have few rows (one per request) against large weights; MKL's packed-B GEMM is
markedly faster there than the plain call. The packed layout depends only on W's shape (the
row-count hint does not change it), so one packed copy serves every row count. Packing is
verified against ``F.linear`` once and silently skipped where MKL is unavailable.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F


def _mkl_ops_available() -> bool:
    return bool(torch.backends.mkl.is_available()) and hasattr(torch.ops.mkl, "_mkl_linear")


# Above this many rows the plain GEMM is as fast or faster (prefill), measured on x86 MKL.
PACKED_MAX_ROWS = 64


class Linear:
    def __init__(self, weight: torch.Tensor, bias: torch.Tensor | None = None) -> None:
        self.weight = weight  # [out, in]
        self.bias = bias
        self.packed: torch.Tensor | None = None

    def pack(self) -> bool:
        """Pack the weight for MKL (CPU float32 only); returns whether packing is in use."""
        w = self.weight
        if self.packed is not None:
            return True
        if w.device.type != "cpu" or w.dtype != torch.float32 or not _mkl_ops_available():
            return False
        packed = torch.ops.mkl._mkl_reorder_linear_weight(w, 1)
        probe = torch.randn(3, w.shape[1], generator=torch.Generator().manual_seed(0))
        got = torch.ops.mkl._mkl_linear(probe, packed, w, self.bias, 3)
        want = F.linear(probe, w, self.bias)
        if not torch.allclose(got, want, rtol=1e-4, atol=1e-4):
            return False
        self.packed = packed
        return True

    def __call__(self, x: torch.Tensor) -> torch.Tensor:
        if self.packed is not None and x.dim() == 2 and 0 < x.shape[0] <= PACKED_MAX_ROWS:
            return torch.ops.mkl._mkl_linear(x, self.packed, self.weight, self.bias, x.shape[0])
        return F.linear(x, self.weight, self.bias)
