"""``KVGATE_CPU_ISA``: the highest x86 vector ISA the CPU path may use (imports no torch).

``auto`` (the default)
    kvgate's CPU GEMM uses the best build the CPU runs (AVX-512, else AVX2 + FMA); torch and
    oneDNN choose their own kernels.
``avx2``
    Everything is held to AVX2, so an AVX-512 machine computes what an AVX2-only one does (CI runs
    the CPU-kernel and model-parity tests this way as well): kvgate's GEMM uses its AVX2 build,
    torch's own kernels are dispatched at AVX2 (``ATEN_CPU_CAPABILITY=avx2``) and oneDNN's are
    capped at AVX2 (``ONEDNN_MAX_CPU_ISA=AVX2``).

Native bf16 (:func:`native_bf16`): a CPU with AMX-BF16 or AVX512_BF16 multiplies bf16 matrices
on its own units (oneDNN's AMX or ``vdpbf16ps`` kernels), so ``dtype=auto`` serves float
checkpoints in bf16 there (``engine/runtime/device.py``). It is read from the kernel's CPU flags
(``/proc/cpuinfo``), once, and is None under ``avx2``: oneDNN held to AVX2 has no bf16 units.

torch and oneDNN read their two variables once, when the process runs its first CPU kernel, not at
import; so :func:`export_torch_caps` runs when the engine's runtime is imported
(engine/runtime/__init__.py; that import runs no torch op). Values already set for those two
variables are kept. A process that ran torch ops before importing the runtime keeps torch's own
choice: the GEMM still takes its AVX2 build and ``engine/runtime/kernels/cpu/gemm.py`` logs that
torch was not capped.
"""

from __future__ import annotations

import functools
import os
from collections.abc import Mapping, MutableMapping
from pathlib import Path

from engine.config import CPU_ISA

ENV = CPU_ISA.name
CHOICES = ("auto", "avx2")
# what ``avx2`` exports for torch (ATen's dispatch) and oneDNN, unless already set
TORCH_CAPS = {"ATEN_CPU_CAPABILITY": "avx2", "ONEDNN_MAX_CPU_ISA": "AVX2"}
CPUINFO = Path("/proc/cpuinfo")
# Native bf16, best first: the units and the flags each needs. torch's oneDNN bf16 linear also
# asks for AVX-512 BW/VL/DQ (every CPU with these units has them).
AVX512_CORE = ("avx512f", "avx512bw", "avx512vl", "avx512dq")
BF16_UNITS: tuple[tuple[str, tuple[str, ...]], ...] = (
    ("amx", ("amx_tile", "amx_bf16", *AVX512_CORE)),
    ("avx512_bf16", ("avx512_bf16", *AVX512_CORE)),
)
# what bench results record of a CPU: its vector and matrix extensions
VECTOR_FLAG_PREFIXES = ("avx", "amx", "fma", "f16c")


def requested(environ: Mapping[str, str] = os.environ) -> str:
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


def read_flags(cpuinfo: Path = CPUINFO) -> frozenset[str]:
    """The first processor's flags in ``cpuinfo`` (the kernel's names: ``avx512_bf16``,
    ``amx_bf16``, ...); empty where there is no such file (not Linux)."""
    try:
        text = cpuinfo.read_text(encoding="utf-8", errors="replace")
    except OSError:
        return frozenset()
    for line in text.splitlines():
        key, _, value = line.partition(":")
        if key.strip() == "flags":
            return frozenset(value.split())
    return frozenset()


@functools.cache
def cpu_flags() -> frozenset[str]:
    """This CPU's flags, read once."""
    return read_flags()


def vector_flags(flags: frozenset[str] | None = None) -> list[str]:
    """The vector and matrix extensions among ``flags`` (this CPU's by default), sorted."""
    flags = cpu_flags() if flags is None else flags
    return sorted(f for f in flags if f.startswith(VECTOR_FLAG_PREFIXES))


def bf16_units(flags: frozenset[str]) -> str | None:
    """ "amx" or "avx512_bf16": the best bf16 matrix units ``flags`` name; None without."""
    for units, needs in BF16_UNITS:
        if set(needs) <= flags:
            return units
    return None


def native_bf16(
    environ: Mapping[str, str] = os.environ, flags: frozenset[str] | None = None
) -> str | None:
    """This CPU's bf16 units ("amx", "avx512_bf16") where kvgate may use them: None without
    them and under ``KVGATE_CPU_ISA=avx2`` (a bad value of it counts as ``auto`` here; it is
    refused where the CPU GEMM is loaded)."""
    try:
        if requested(environ) == "avx2":
            return None
    except ValueError:
        pass
    return bf16_units(cpu_flags() if flags is None else flags)
