"""Packed-panel float32 GEMM for x86 CPUs (``gemm.c``: AVX-512, or AVX2 + FMA), built on first use.

``y = x @ W.T + b`` for any number of rows: the weight is reordered once into panels of output
columns (:meth:`PanelGemm.pack`), and :meth:`PanelGemm.matmul` streams each panel once per 128
rows of ``x``. With AVX-512 on one thread it measured 1.5-1.9x faster than oneDNN's packed linear
for 1-8 rows (the decode LM head of Qwen2.5-0.5B: 19 vs 34 ms at 1 row, 24 vs 38 ms at 8) and
within 4% of it up to 2688 rows, so one packed copy of each weight serves decode and prefill
alike. The AVX2 build, against oneDNN held to AVX2 on the same CPU: 20 vs 46 ms for the decode
linears of one row, 57 vs 62 at 8 rows, 40 vs 43 at 128. Each output is summed in the same order
whatever the row count, so a row's result does not depend on its batch; a vector lane is an output
column, so the AVX2 and AVX-512 builds give the same bits.

The C source is compiled with the system C compiler into a per-user cache directory
(``KVGATE_CACHE_DIR``, default ``~/.cache/kvgate``), keyed by the source hash and flags, and
loaded with ctypes, which releases the GIL during the call: with more than one torch thread the
panels are split across a thread pool (whole panels per thread: no sum is split, so the thread
count does not change a result). :func:`load` gives None (and callers fall back) on other CPUs,
without a compiler, or with ``KVGATE_CPU_GEMM=0``. The build follows torch's CPU capability
(AVX-512 or AVX2), held to AVX2 by ``KVGATE_CPU_ISA=avx2`` (``engine/runtime/cpu_isa.py``, which
caps torch and oneDNN too) or, for this GEMM alone, by ``KVGATE_CPU_GEMM=avx2``.
"""

from __future__ import annotations

import ctypes
import functools
import logging
import os
import platform
from dataclasses import dataclass
from pathlib import Path

import torch

from engine.config import CPU_GEMM
from engine.runtime import cpu_isa
from engine.runtime.kernels.cpu import build

SOURCE = Path(__file__).with_name("gemm.c")
ISA_FLAGS = {"avx512": ("-mavx512f", "-mfma"), "avx2": ("-mavx2", "-mfma")}
_MIN_SPLIT_MACS = 1 << 22  # below this, one thread is faster than handing out slices

log = logging.getLogger(__name__)


def best_isa() -> str | None:
    """The ISA to build for: torch's CPU capability, held to AVX2 by ``KVGATE_CPU_ISA=avx2`` or
    ``KVGATE_CPU_GEMM=avx2``; None with ``KVGATE_CPU_GEMM=0`` or off x86."""
    cap = cpu_isa.requested()  # ValueError naming the variable for a bad value
    choice = os.environ.get(CPU_GEMM.name, CPU_GEMM.default).lower()
    if choice == "0" or platform.machine().lower() not in ("x86_64", "amd64"):
        return None
    capability = torch.backends.cpu.get_cpu_capability()
    if cap == "avx2" and capability == "AVX512":
        _warn_torch_not_capped()
    if capability == "AVX512" and choice != "avx2" and cap != "avx2":
        return "avx512"
    return "avx2" if capability in ("AVX512", "AVX2") else None


@functools.cache
def _warn_torch_not_capped() -> None:
    log.warning(
        "%s=avx2, but torch still dispatches AVX-512 kernels (it chose before `engine` was "
        "imported, or ATEN_CPU_CAPABILITY says so): set ATEN_CPU_CAPABILITY=avx2 and "
        "ONEDNN_MAX_CPU_ISA=AVX2 at start; the CPU GEMM uses its AVX2 build",
        cpu_isa.ENV,
    )


@dataclass(frozen=True)
class PanelGemm:
    lib: ctypes.CDLL
    isa: str
    panel: int  # output columns per panel: two vectors

    def pack(self, weight: torch.Tensor) -> torch.Tensor:
        """[n, k] float32 -> [ceil(n / panel), k, panel] panels, zero-padded past row n."""
        n, k = weight.shape
        panels = -(-n // self.panel)
        padded = weight.new_zeros(panels * self.panel, k)
        padded[:n] = weight
        return padded.view(panels, self.panel, k).transpose(1, 2).contiguous()

    def matmul(
        self, x: torch.Tensor, packed: torch.Tensor, n: int, bias: torch.Tensor | None
    ) -> torch.Tensor:
        """x [m, k] float32, ``packed`` from :meth:`pack`, bias [n] contiguous -> [m, n].

        Every argument is checked before the call into C, which trusts shapes and pointers:
        a non-contiguous ``x`` is copied; anything else wrong raises ``ValueError``."""
        self._check(x, packed, n, bias)
        m, k = x.shape
        x = x.contiguous()
        out = x.new_empty(m, n)
        args = (
            x.data_ptr(), m, k, packed.data_ptr(), n,
            None if bias is None else bias.data_ptr(), out.data_ptr(),
        )  # fmt: skip
        lib = self.lib
        build.split_panels(
            lambda p0, p1: lib.kvgate_gemm(*args, p0, p1),
            packed.shape[0],
            m * n * k,
            _MIN_SPLIT_MACS,
        )
        return out

    def _check(
        self, x: torch.Tensor, packed: torch.Tensor, n: int, bias: torch.Tensor | None
    ) -> None:
        for name, t in (("x", x), ("packed", packed), ("bias", bias)):
            if t is None:
                continue
            if t.dtype != torch.float32 or t.device.type != "cpu":
                raise ValueError(
                    f"{name} must be a float32 CPU tensor, got {t.dtype} on {t.device}"
                )
        if x.dim() != 2 or packed.dim() != 3:
            shapes = f"{tuple(x.shape)} and {tuple(packed.shape)}"
            raise ValueError(f"x must be [m, k] and packed [panels, k, panel], got {shapes}")
        k = x.shape[1]
        if packed.shape[1:] != (k, self.panel):
            raise ValueError(f"x has {k} columns, the packed weight {tuple(packed.shape)}")
        if not packed.is_contiguous():
            raise ValueError("the packed weight must be contiguous (as pack() returns it)")
        if n < 1 or packed.shape[0] != -(-n // self.panel):
            raise ValueError(f"n = {n} outputs do not match {packed.shape[0]} panels")
        if bias is not None and (bias.shape != (n,) or not bias.is_contiguous()):
            raise ValueError(f"bias must be a contiguous [{n}] tensor, got {tuple(bias.shape)}")


@functools.cache
def _load(isa: str) -> PanelGemm | None:
    lib = build.load_library(SOURCE, isa, ISA_FLAGS[isa])
    if lib is None:
        return None
    i64, ptr = ctypes.c_int64, ctypes.c_void_p
    lib.kvgate_gemm.restype = None
    lib.kvgate_gemm.argtypes = [ptr, i64, i64, ptr, i64, ptr, ptr, i64, i64]
    lib.kvgate_gemm_panel.restype = ctypes.c_int
    return PanelGemm(lib, isa, lib.kvgate_gemm_panel())


def load(isa: str | None = None) -> PanelGemm | None:
    """The GEMM for ``isa`` ("avx512" / "avx2"; default: the best this CPU and the environment
    allow), or None where it cannot run or be built."""
    isa = isa or best_isa()
    return None if isa is None else _load(isa)
