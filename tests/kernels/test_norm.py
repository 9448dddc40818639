from __future__ import annotations

import pytest
import torch

from engine.runtime.kernels.triton.norm import rms_norm
from tests.kernels.helpers import TOLERANCE


def _reference(x: torch.Tensor, weight: torch.Tensor, eps: float) -> torch.Tensor:
    """The decoder's torch path (HF numerics), evaluated as written."""
    xf = x.float()
    xf = xf * torch.rsqrt(xf.pow(2).mean(-1, keepdim=True) + eps)
    return weight * xf.to(x.dtype)


@pytest.mark.parametrize(("dtype", "hidden"), [(torch.float32, 96), (torch.bfloat16, 64)])
def test_rms_norm_with_and_without_residual(dtype, hidden, device):
    gen = torch.Generator().manual_seed(5)
    x = (torch.randn(5, hidden, generator=gen) * 3).to(dtype)
    res = torch.randn(5, hidden, generator=gen).to(dtype)
    w = (torch.rand(hidden, generator=gen) + 0.5).to(dtype)
    atol, rtol = TOLERANCE[dtype]
    out = rms_norm(x.to(device), w.to(device), 1e-6)
    torch.testing.assert_close(out.cpu(), _reference(x, w, 1e-6), atol=atol, rtol=rtol)
    out, h = rms_norm(x.to(device), w.to(device), 1e-6, residual=res.to(device))
    # exact on a GPU; the interpreter rounds fp32 -> bf16 toward zero (one ulp off at most)
    torch.testing.assert_close(
        h.cpu(), x + res, atol=0, rtol=0 if dtype == torch.float32 else 2**-7
    )
    torch.testing.assert_close(out.cpu(), _reference(x + res, w, 1e-6), atol=atol, rtol=rtol)


def test_rms_norm_rejects_bad_arguments(device):
    x = torch.zeros(2, 8, device=device)
    with pytest.raises(ValueError, match="weight must be"):
        rms_norm(x, torch.ones(4, device=device), 1e-6)
    with pytest.raises(ValueError, match="residual"):
        rms_norm(x, torch.ones(8, device=device), 1e-6, residual=x.half())
