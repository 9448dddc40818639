"""Fused RMSNorm (optionally with the residual add before it), one program per token row.

    residual given:  h = x + residual;  returns (rms_norm(h) * weight, h)   one read of x and
                                                                             residual, two writes
    otherwise:       returns rms_norm(x) * weight

Numerics follow the torch path of the decoder (HF): the row is normalized in fp32, rounded to the
input dtype, then multiplied by the weight.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from engine.runtime.kernels.triton._common import SUPPORTED_DTYPES, check_device, launch, next_pow2


# A Triton kernel: untyped by design (engine/runtime/kernels/triton/_common.py)
@triton.jit  # type: ignore[untyped-decorator]  # every integer argument is fixed by the model geometry
def _rms_norm_kernel(  # type: ignore[no-untyped-def]
    x_ptr,
    res_ptr,
    w_ptr,
    out_ptr,
    h_ptr,
    hidden,
    eps,
    stride_x,
    stride_r,
    stride_o,
    stride_h,
    BLOCK: tl.constexpr,
    HAS_RESIDUAL: tl.constexpr,
):
    row = tl.program_id(0).to(tl.int64)
    cols = tl.arange(0, BLOCK)
    ok = cols < hidden
    x = tl.load(x_ptr + row * stride_x + cols, mask=ok, other=0.0)
    if HAS_RESIDUAL:  # add in fp32, round once (what a half-precision torch add does)
        r = tl.load(res_ptr + row * stride_r + cols, mask=ok, other=0.0)
        x = (x.to(tl.float32) + r.to(tl.float32)).to(x.dtype)
        tl.store(h_ptr + row * stride_h + cols, x, mask=ok)
    xf = x.to(tl.float32)
    rstd = 1.0 / tl.sqrt(tl.sum(xf * xf, 0) / hidden + eps)
    normed = (xf * rstd).to(x.dtype).to(tl.float32)
    w = tl.load(w_ptr + cols, mask=ok, other=0.0).to(tl.float32)
    tl.store(out_ptr + row * stride_o + cols, (normed * w).to(out_ptr.dtype.element_ty), mask=ok)


def _check(x: torch.Tensor, weight: torch.Tensor, residual: torch.Tensor | None) -> None:
    if x.dim() != 2 or x.stride(1) != 1:
        raise ValueError(f"x must be [rows, hidden] with contiguous rows, got {tuple(x.shape)}")
    if x.dtype not in SUPPORTED_DTYPES or weight.dtype != x.dtype:
        raise ValueError(f"x/weight dtypes {x.dtype}/{weight.dtype}: one of {SUPPORTED_DTYPES}")
    if weight.shape != (x.shape[1],) or weight.stride(0) != 1:
        raise ValueError(f"weight must be contiguous [{x.shape[1]}], got {tuple(weight.shape)}")
    if residual is not None:
        if residual.shape != x.shape or residual.dtype != x.dtype or residual.stride(1) != 1:
            raise ValueError("residual must match x in shape and dtype, with contiguous rows")
        check_device(x, weight, residual)
    else:
        check_device(x, weight)


def rms_norm(
    x: torch.Tensor, weight: torch.Tensor, eps: float, residual: torch.Tensor | None = None
) -> torch.Tensor | tuple[torch.Tensor, torch.Tensor]:
    """RMSNorm of x [rows, hidden]; with ``residual``, of x + residual, returning (normed, sum)."""
    _check(x, weight, residual)
    out = torch.empty_like(x)
    h = torch.empty_like(x) if residual is not None else out
    if x.shape[0]:
        block = next_pow2(x.shape[1])
        res = residual if residual is not None else x
        args = (
            x, res, weight, out, h, x.shape[1], eps, x.stride(0), res.stride(0), out.stride(0),
            h.stride(0),
        )  # fmt: skip
        launch(
            _rms_norm_kernel,
            (x.shape[0],),
            args,
            BLOCK=block,
            HAS_RESIDUAL=residual is not None,
            num_warps=min(16, max(1, block // 256)),
            num_stages=1,
        )
    return (out, h) if residual is not None else out
