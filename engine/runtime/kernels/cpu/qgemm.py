"""GEMM over weights kept in GGUF's Q4_1 and Q8_0 block formats (``qgemm.c``: AVX-512, or AVX2 +
FMA + F16C), built on first use like ``gemm.py``.

``y = x @ W.T + b`` with float32 ``x`` and ``y``: the weight stays 5 (Q4_1) or 8.5 (Q8_0) bits a
weight in memory and is widened in registers, so a decode step reads a sixth to a quarter of the
bytes the float32 GEMM reads. Block sums are scaled once per block of 32 (``qgemm.c``), the same
order for any row count, thread count and ISA. :func:`load` gives None where it cannot run (other
CPUs, no compiler, ``KVGATE_CPU_GEMM=0``); callers then dequantize to float32.
"""

from __future__ import annotations

import ctypes
import functools
from dataclasses import dataclass
from pathlib import Path

import torch

from engine.runtime.kernels.cpu import build, gemm

SOURCE = Path(__file__).with_name("qgemm.c")
ISA_FLAGS = {"avx512": ("-mavx512f", "-mfma", "-mf16c"), "avx2": ("-mavx2", "-mfma", "-mf16c")}
QBLOCK = 32  # weights per block along the input dimension
_MIN_SPLIT_MACS = 1 << 20


@dataclass(frozen=True)
class PackedBlocks:
    """A weight in the kernel's panel layout (``qgemm.c``'s header)."""

    kind: str  # "q4_1" | "q8_0"
    qs: torch.Tensor  # uint8 nibble pairs (q4_1) or int8 (q8_0) panels
    scales: torch.Tensor  # float16 panels: d and m (q4_1) or d (q8_0)
    n: int
    k: int

    @property
    def nbytes(self) -> int:
        return self.qs.nbytes + self.scales.nbytes


@dataclass(frozen=True)
class QuantGemm:
    lib: ctypes.CDLL
    isa: str
    panel: int  # outputs per panel: two vectors

    @property
    def parallel_for(self) -> int:
        """The address of ``kvgate_parallel_for`` (its thread pool), for other C kernels."""
        return build.function_address(self.lib, "kvgate_parallel_for")

    def pack_q4_1(self, q: torch.Tensor, d: torch.Tensor, m: torch.Tensor) -> PackedBlocks:
        """q [n, k] uint8 in 0..15, d and m [n, k / 32] float16 (weight = d * q + m)."""
        n, k = _check_blocks(q, d, torch.uint8)
        p, half = -(-n // self.panel), self.panel // 2
        panels = _pad(q, p * self.panel).view(p, self.panel, k // QBLOCK, QBLOCK)
        panels = panels.permute(0, 2, 3, 1)  # [panels, blocks, 32, panel]
        qs = (panels[..., :half] | (panels[..., half:] << 4)).contiguous()
        scales = torch.stack((self._scale_panels(d, p), self._scale_panels(m, p)), dim=2)
        return PackedBlocks("q4_1", qs, scales.contiguous(), n, k)

    def pack_q8_0(self, q: torch.Tensor, d: torch.Tensor) -> PackedBlocks:
        """q [n, k] int8, d [n, k / 32] float16 (weight = d * q)."""
        n, k = _check_blocks(q, d, torch.int8)
        p = -(-n // self.panel)
        panels = _pad(q, p * self.panel).view(p, self.panel, k // QBLOCK, QBLOCK)
        qs = panels.permute(0, 2, 3, 1).contiguous()
        return PackedBlocks("q8_0", qs, self._scale_panels(d, p).contiguous(), n, k)

    def _scale_panels(self, s: torch.Tensor, panels: int) -> torch.Tensor:
        return _pad(s, panels * self.panel).view(panels, self.panel, -1).transpose(1, 2)

    def matmul(self, x: torch.Tensor, w: PackedBlocks, bias: torch.Tensor | None) -> torch.Tensor:
        """x [m, k] float32 -> [m, n]; arguments are checked before the call into C."""
        _check_call(x, w, bias)
        x = x.contiguous()
        m = x.shape[0]
        out = x.new_empty(m, w.n)
        if m == 0:
            return out
        lib = self.lib
        fn = lib.kvgate_q4_1_gemm_threads if w.kind == "q4_1" else lib.kvgate_q8_0_gemm_threads
        threads = torch.get_num_threads() if m * w.n * w.k >= _MIN_SPLIT_MACS else 1
        status = fn(
            x.data_ptr(), m, w.k, w.qs.data_ptr(), w.scales.data_ptr(), w.n,
            None if bias is None else bias.data_ptr(), out.data_ptr(), w.qs.shape[0], threads,
        )  # fmt: skip
        if status != 0:
            raise MemoryError("qgemm: no memory for the block sums of x")
        return out


def _pad(t: torch.Tensor, rows: int) -> torch.Tensor:
    if t.shape[0] == rows:
        return t
    padded = t.new_zeros(rows, *t.shape[1:])
    padded[: t.shape[0]] = t
    return padded


def _check_blocks(q: torch.Tensor, d: torch.Tensor, dtype: torch.dtype) -> tuple[int, int]:
    if q.dim() != 2 or q.dtype != dtype:
        raise ValueError(f"q must be a 2-d {dtype} tensor, got {q.dtype} {tuple(q.shape)}")
    n, k = q.shape
    if k % QBLOCK or d.shape != (n, k // QBLOCK) or d.dtype != torch.float16:
        raise ValueError(f"q {tuple(q.shape)} needs float16 scales [{n}, {k // QBLOCK}]")
    return n, k


def _check_call(x: torch.Tensor, w: PackedBlocks, bias: torch.Tensor | None) -> None:
    if x.dtype != torch.float32 or x.device.type != "cpu" or x.dim() != 2:
        raise ValueError(f"x must be a 2-d float32 CPU tensor, got {x.dtype} {tuple(x.shape)}")
    if x.shape[1] != w.k:
        raise ValueError(f"x has {x.shape[1]} columns, the weight {w.k}")
    if not (w.qs.is_contiguous() and w.scales.is_contiguous()):
        raise ValueError("the packed weight must be contiguous (as pack_* returns it)")
    if bias is not None and (
        bias.shape != (w.n,) or bias.dtype != torch.float32 or not bias.is_contiguous()
    ):
        raise ValueError(f"bias must be a contiguous float32 [{w.n}] tensor")


@functools.cache
def _load(isa: str) -> QuantGemm | None:
    lib = build.load_library(SOURCE, isa, ISA_FLAGS[isa])
    if lib is None:
        return None
    i64, ptr = ctypes.c_int64, ctypes.c_void_p
    for fn in (lib.kvgate_q4_1_gemm_threads, lib.kvgate_q8_0_gemm_threads):
        fn.restype = ctypes.c_int
        fn.argtypes = [ptr, i64, i64, ptr, ptr, i64, ptr, ptr, i64, ctypes.c_int]
    lib.kvgate_qgemm_panel.restype = ctypes.c_int
    return QuantGemm(lib, isa, lib.kvgate_qgemm_panel())


def load(isa: str | None = None) -> QuantGemm | None:
    """The block GEMM for ``isa`` ("avx512" / "avx2"; default: as ``gemm.best_isa`` chooses),
    or None where it cannot run or be built."""
    isa = isa or gemm.best_isa()
    return None if isa is None else _load(isa)
