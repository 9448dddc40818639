"""``KVGATE_CPU_ISA``: the highest x86 vector ISA the CPU path may use (imports no torch).

``auto`` (the default)
    kvgate's CPU GEMM uses the best build the CPU runs (AVX-512, else AVX2 + FMA); torch and
    oneDNN choose their own kernels.
``avx2``
    Everything is held to AVX2, so an AVX-512 machine computes what an AVX2-only one does (CI runs
    the CPU-kernel and model-parity tests this way as well): kvgate's GEMM uses its AVX2 build,
    torch's own kernels are dispatched at AVX2 (``ATEN_CPU_CAPABILITY=avx2``) and oneDNN's are
    capped at AVX2 (``ONEDNN_MAX_CPU_ISA=AVX2``).

torch and oneDNN read their two variables once, when the process runs its first CPU kernel, not at
import; so :func:`export_torch_caps` runs when the engine's runtime is imported
(engine/runtime/__init__.py; that import runs no torch op). Values already set for those two
variables are kept. A process that ran torch ops before importing the runtime keeps torch's own
choice: the GEMM still takes its AVX2 build and ``engine/runtime/kernels/cpu/gemm.py`` logs that
torch was not capped.
"""

from __future__ import annotations

import os
from collections.abc import MutableMapping

from engine.config import CPU_ISA

ENV = CPU_ISA.name
CHOICES = ("auto", "avx2")
# what ``avx2`` exports for torch (ATen's dispatch) and oneDNN, unless already set
TORCH_CAPS = {"ATEN_CPU_CAPABILITY": "avx2", "ONEDNN_MAX_CPU_ISA": "AVX2"}


def requested(environ: MutableMapping[str, str] = os.environ) -> str:
    """The chosen cap, "auto" or "avx2"; ValueError naming the variable for anything else."""
    value = environ.get(ENV, "").strip().lower() or "auto"
    if value not in CHOICES:
        raise ValueError(f"{ENV} must be one of {', '.join(CHOICES)}, got {environ[ENV]!r}")
    return value


def export_torch_caps(environ: MutableMapping[str, str] = os.environ) -> None:
    """With ``avx2``, set torch's and oneDNN's ISA variables (where unset). A bad value does
    nothing here: it is refused where the CPU GEMM is loaded, with the message above."""
    try:
        cap = requested(environ)
    except ValueError:
        return
    if cap == "avx2":
        for name, value in TORCH_CAPS.items():
            environ.setdefault(name, value)
