"""GEMM over weights kept in GGUF's Q4_1 and Q8_0 block formats, built on first use like
``gemm.py`` (AVX-512, or AVX2 + FMA + F16C).

``y = x @ W.T + b`` with float32 ``x`` and ``y``: the weight stays 5 (Q4_1) or 8.5 (Q8_0) bits a
weight in memory, so a decode step reads a sixth to a quarter of the bytes the float32 GEMM
reads. Three kernels, by the activations' precision (the ``activations`` of ``pack_*``):

- float32 (``qgemm.c``): the weight is widened in registers; the sums are float32 products of
  the stored weights, scaled once per block of 32;
- int16 and int8 (``q8gemm.c``, built once for each): each row of ``x`` is quantized per block
  of 32 (int8 as llama.cpp does), so a block's dot product is an exact integer sum at two (int16)
  or four (int8) multiply-adds an instruction; the error is the rounding of ``x``, at most
  ``max|x| / 65534`` or ``max|x| / 254`` an input (:func:`rounding_bound`).

All run every sum in the same order for any row count, thread count and ISA. :func:`load`
gives None where they cannot run (other CPUs, no compiler, ``KVGATE_CPU_GEMM=0``); callers then
dequantize to float32.
"""

from __future__ import annotations

import ctypes
import functools
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import torch

from engine.runtime.kernels.cpu import build, gemm

SOURCE = Path(__file__).with_name("qgemm.c")
Q8_SOURCE = Path(__file__).with_name("q8gemm.c")  # built twice: int8, and int16 (-DKVGATE_X16)
ISA_FLAGS = {"avx512": ("-mavx512f", "-mfma", "-mf16c"), "avx2": ("-mavx2", "-mfma", "-mf16c")}
# torch's AVX512 capability (gemm.best_isa) includes BW, which the integer kernels' byte ops need
Q8_ISA_FLAGS = {**ISA_FLAGS, "avx512": ("-mavx512f", "-mavx512bw", "-mfma", "-mf16c")}
FLOAT32, INT16, INT8 = "float32", "int16", "int8"  # the activations' precision
ACTIVATIONS = (FLOAT32, INT16, INT8)
LEVELS = {INT16: 32767, INT8: 127}  # an integer kind's largest |x| step count
Q4_1, Q8_0, Q4_1_INT8, Q8_0_INT8 = "q4_1", "q8_0", "q4_1/int8", "q8_0/int8"
Q4_1_INT16, Q8_0_INT16 = "q4_1/int16", "q8_0/int16"
# each kind's activations (so its library) and C function (the same signature)
FUNCTIONS = {
    Q4_1: (FLOAT32, "kvgate_q4_1_gemm_threads"),
    Q8_0: (FLOAT32, "kvgate_q8_0_gemm_threads"),
    Q4_1_INT8: (INT8, "kvgate_q4_1_q8_gemm_threads"),
    Q8_0_INT8: (INT8, "kvgate_q8_0_q8_gemm_threads"),
    Q4_1_INT16: (INT16, "kvgate_q4_1_q16_gemm_threads"),
    Q8_0_INT16: (INT16, "kvgate_q8_0_q16_gemm_threads"),
}
KINDS = tuple(FUNCTIONS)  # the order of ``QuantGemm.functions``
# (weight format, activations) -> kind: a kind is its format, then "/<activations>" unless float32
_KIND = {(k.split("/")[0], act): k for k, (act, _) in FUNCTIONS.items()}
QBLOCK = 32  # weights per block along the input dimension
# below this, one thread: a decode row of the default model's smallest linear (576 x 576, 332k
# multiply-adds, ~10 us) still gains from two (its decode step 7% faster than at 1 << 20)
_MIN_SPLIT_MACS = 1 << 18


@dataclass(frozen=True)
class PackedBlocks:
    """A weight in the kernel's panel layout (``qgemm.c``'s header)."""

    kind: str  # one of KINDS: the weight's format and the activations' precision
    qs: torch.Tensor  # uint8 nibble pairs (q4_1) or int8 (q8_0) panels
    scales: torch.Tensor  # float16 panels: d and m (q4_1) or d (q8_0)
    n: int
    k: int

    @property
    def nbytes(self) -> int:
        return self.qs.nbytes + self.scales.nbytes


@dataclass(frozen=True)
class QuantGemm:
    libraries: dict[str, ctypes.CDLL]  # by activations: qgemm.c's, q8gemm.c's int16 and int8
    isa: str
    panel: int  # outputs per panel: two vectors (the same in every kernel)

    @property
    def parallel_for(self) -> int:
        """The address of ``kvgate_parallel_for`` (its thread pool), for other C kernels."""
        return build.function_address(self.libraries[FLOAT32], "kvgate_parallel_for")

    @property
    def functions(self) -> tuple[int, ...]:
        """The addresses of the ``*_gemm_threads`` functions, in the order of KINDS."""
        return tuple(
            build.function_address(self.libraries[act], name) for act, name in FUNCTIONS.values()
        )

    def function(self, kind: str) -> Callable[..., int]:
        """The C function for a packed weight of ``kind``."""
        act, name = FUNCTIONS[kind]
        fn: Callable[..., int] = getattr(self.libraries[act], name)
        return fn

    def pack_q4_1(
        self, q: torch.Tensor, d: torch.Tensor, m: torch.Tensor, *, activations: str = FLOAT32
    ) -> PackedBlocks:
        """q [n, k] uint8 in 0..15, d and m [n, k / 32] float16 (weight = d * q + m), for the
        kernel of ``activations`` (the integer kernels share ``q8gemm.c``'s layout)."""
        n, k = _check_blocks(q, d, torch.uint8)
        p, half = -(-n // self.panel), self.panel // 2
        padded = _pad(q, p * self.panel)
        if activations != FLOAT32:  # [panels, blocks, 4 parts, panel, 2 halves, 4]
            parts = padded.view(p, self.panel, k // QBLOCK, 4, 2, 4).permute(0, 2, 3, 1, 4, 5)
            qs = (parts[..., 0, :] | (parts[..., 1, :] << 4)).contiguous()  # a byte: both
        else:  # [panels, blocks, 32, panel]: a byte holds two outputs
            panels = padded.view(p, self.panel, k // QBLOCK, QBLOCK).permute(0, 2, 3, 1)
            qs = (panels[..., :half] | (panels[..., half:] << 4)).contiguous()
        scales = torch.stack((self._scale_panels(d, p), self._scale_panels(m, p)), dim=2)
        return PackedBlocks(_KIND[Q4_1, activations], qs, scales.contiguous(), n, k)

    def pack_q8_0(
        self, q: torch.Tensor, d: torch.Tensor, *, activations: str = FLOAT32
    ) -> PackedBlocks:
        """q [n, k] int8, d [n, k / 32] float16 (weight = d * q); ``activations`` as in
        pack_q4_1."""
        n, k = _check_blocks(q, d, torch.int8)
        p = -(-n // self.panel)
        padded = _pad(q, p * self.panel)
        if activations != FLOAT32:  # [panels, blocks, 8 parts, panel, 4]
            qs = padded.view(p, self.panel, k // QBLOCK, 8, 4).permute(0, 2, 3, 1, 4)
        else:  # [panels, blocks, 32, panel]
            qs = padded.view(p, self.panel, k // QBLOCK, QBLOCK).permute(0, 2, 3, 1)
        scales = self._scale_panels(d, p).contiguous()
        return PackedBlocks(_KIND[Q8_0, activations], qs.contiguous(), scales, n, k)

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
        fn = self.function(w.kind)
        threads = torch.get_num_threads() if m * w.n * w.k >= _MIN_SPLIT_MACS else 1
        status = fn(
            x.data_ptr(), m, w.k, w.qs.data_ptr(), w.scales.data_ptr(), w.n,
            None if bias is None else bias.data_ptr(), out.data_ptr(), w.qs.shape[0], threads,
        )  # fmt: skip
        if status != 0:
            raise MemoryError("qgemm: no memory for the block sums of x")
        return out


def rounding_bound(x: torch.Tensor, scaled: torch.Tensor, activations: str) -> torch.Tensor:
    """The most an integer kernel's ``x @ W.T`` [m, n] can differ from exact products of the
    same weights: each input rounds by at most half its block's step ``max|x| / LEVELS`` and
    meets ``scaled`` = d * q [n, k] (Q4_1's offset m meets the exact block sum of x), so a block
    errs by at most ``max|x| / (2 * LEVELS) * sum|d * q|``."""
    m, k = x.shape
    half_step = x.abs().view(m, k // QBLOCK, QBLOCK).amax(-1) / (2.0 * LEVELS[activations])
    weight = scaled.abs().view(scaled.shape[0], k // QBLOCK, QBLOCK).sum(-1)
    return half_step @ weight.T


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
    libraries = {
        FLOAT32: build.load_library(SOURCE, isa, ISA_FLAGS[isa]),
        INT8: build.load_library(Q8_SOURCE, isa, Q8_ISA_FLAGS[isa]),
        INT16: build.load_library(Q8_SOURCE, isa, (*Q8_ISA_FLAGS[isa], "-DKVGATE_X16")),
    }
    built = {act: lib for act, lib in libraries.items() if lib is not None}
    if len(built) < len(libraries):
        return None
    i64, ptr = ctypes.c_int64, ctypes.c_void_p
    for act, name in FUNCTIONS.values():
        fn = getattr(built[act], name)
        fn.restype = ctypes.c_int
        fn.argtypes = [ptr, i64, i64, ptr, ptr, i64, ptr, ptr, i64, ctypes.c_int]
    lib = built[FLOAT32]
    lib.kvgate_qgemm_panel.restype = ctypes.c_int
    panel = lib.kvgate_qgemm_panel()
    pool = build.function_address(lib, "kvgate_parallel_for")
    for act, tag in ((INT8, "q8"), (INT16, "q16")):
        panel_of = getattr(built[act], f"kvgate_{tag}gemm_panel")
        panel_of.restype = ctypes.c_int
        if panel_of() != panel:
            raise RuntimeError(f"qgemm.c and q8gemm.c ({act}) disagree on the panel ({isa})")
        use_pool = getattr(built[act], f"kvgate_{tag}gemm_use_pool")
        use_pool.argtypes = [ptr]
        use_pool(pool)
    return QuantGemm(built, isa, panel)


def load(isa: str | None = None) -> QuantGemm | None:
    """The block GEMM for ``isa`` ("avx512" / "avx2"; default: as ``gemm.best_isa`` chooses),
    or None where it cannot run or be built."""
    isa = isa or gemm.best_isa()
    return None if isa is None else _load(isa)
