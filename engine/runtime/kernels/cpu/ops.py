"""The float32 CPU ops of a decoder layer in C: RMSNorm with the residual add, RoPE with the
K/V store and SiLU(gate) * up (``ops.c``), and causal attention of decode rows and prefill
chunks through the block tables (``attention.c``: 47 us a layer for one SmolLM2-135M decode row
at 780 keys, where a head-at-a-time loop with a sequential lane sum took 344 us).

Each is one call where the torch reference (``engine/runtime/kernels/reference.py``) makes 10-30
dispatches, which at decode's one token a step cost more than the arithmetic: 15 ms of a 28 ms
SmolLM2-135M step went to torch ops before these. Built like ``gemm.py`` (same ISA choice, same
``KVGATE_CPU_GEMM=0`` to turn kvgate's C kernels off); :func:`load` gives None where they cannot
run, and the dispatcher (``engine/runtime/kernels/__init__.py``) then uses the reference.
"""

from __future__ import annotations

import ctypes
import functools
from dataclasses import dataclass
from pathlib import Path

import torch

from engine.runtime.kernels.cpu import build, gemm, qgemm
from engine.runtime.kernels.metadata import AttentionMetadata

SOURCE = Path(__file__).with_name("ops.c")
ATTENTION = Path(__file__).with_name("attention.c")
ISA_FLAGS = {"avx512": ("-mavx512f", "-mfma"), "avx2": ("-mavx2", "-mfma")}
# ops.c's SiLU loop vectorizes only where a float compare may not trap (results are unchanged)
OPS_FLAGS = ("-fno-trapping-math",)
_MIN_SPLIT_MACS = 1 << 18  # attention below this runs on one thread
HEAD_DIM_MULTIPLE = 16  # decode attention's head dims: whole 16-lane sums


def plain_cpu(t: torch.Tensor) -> bool:
    """A tensor the C ops read as it is: contiguous float32 on the CPU."""
    return t.dtype == torch.float32 and t.is_contiguous() and t.device.type == "cpu"


def _ptr(t: torch.Tensor | None) -> int | None:
    return None if t is None else t.data_ptr()


@dataclass(frozen=True)
class CpuOps:
    lib: ctypes.CDLL
    attn: ctypes.CDLL  # attention.c
    isa: str
    max_head_dim: int  # attention's largest head dim
    parallel: int | None  # qgemm.c's kvgate_parallel_for (its thread pool), where built

    def attends(self, head_dim: int) -> bool:
        """Whether :meth:`paged_attention` runs heads of ``head_dim``."""
        return head_dim % HEAD_DIM_MULTIPLE == 0 and head_dim <= self.max_head_dim

    def rms_norm(
        self, x: torch.Tensor, weight: torch.Tensor, eps: float, residual: torch.Tensor | None
    ) -> torch.Tensor | tuple[torch.Tensor, torch.Tensor]:
        """As ``reference.rms_norm``: with ``residual``, it is overwritten by ``residual + x``."""
        x = x.contiguous()
        rows, hidden = x.numel() // x.shape[-1], x.shape[-1]
        out = torch.empty_like(x)
        self.lib.kvgate_rms_norm(
            x.data_ptr(), _ptr(residual), weight.data_ptr(), eps, rows, hidden, out.data_ptr()
        )
        return out if residual is None else (out, residual)

    def silu_mul(self, gate_up: torch.Tensor, inter: int) -> torch.Tensor:
        """``silu(gate) * up`` of contiguous ``gate_up`` [rows, 2 * inter] ([gate | up]):
        [rows, inter]."""
        rows = gate_up.shape[0]
        out = gate_up.new_empty(rows, inter)
        self.lib.kvgate_silu_mul(gate_up.data_ptr(), rows, inter, out.data_ptr())
        return out

    def rope_store_kv(
        self,
        qkv: torch.Tensor,
        heads: tuple[int, int, int],
        positions: torch.Tensor,
        cos: torch.Tensor,
        sin: torch.Tensor,
        k_cache: torch.Tensor,
        v_cache: torch.Tensor,
        slot_mapping: torch.Tensor,
    ) -> None:
        """Rotate the q and k heads of ``qkv`` [T, (hq + 2 hkv) * d] in place; k and v into the
        cache slots."""
        hq, hkv, d = heads
        self.lib.kvgate_rope_store_kv(
            qkv.data_ptr(), qkv.stride(0), qkv.shape[0], hq, hkv, d, positions.data_ptr(),
            cos.data_ptr(), sin.data_ptr(), k_cache.data_ptr(), v_cache.data_ptr(),
            slot_mapping.data_ptr(),
        )  # fmt: skip

    def paged_attention(
        self,
        q: torch.Tensor,
        k_cache: torch.Tensor,
        v_cache: torch.Tensor,
        meta: AttentionMetadata,
        scale: float,
    ) -> torch.Tensor:
        """Causal attention of q [T, Hq, D] through the block tables (``attention.c``): decode
        rows and prefill chunks alike; [T, Hq, D]."""
        q = q.contiguous()
        t, hq, d = q.shape
        hkv = k_cache.shape[2]
        out = torch.empty(t, hq, d, dtype=q.dtype)
        tables, starts = meta.block_tables, meta.query_start_loc
        attn = self.attn
        threads = torch.get_num_threads() if t * hq * meta.max_seq_len * d >= _MIN_SPLIT_MACS else 1
        status = attn.kvgate_paged_attention(
            q.data_ptr(), hq * d, k_cache.data_ptr(), v_cache.data_ptr(), tables.data_ptr(),
            tables.stride(0), starts.data_ptr(), meta.context_lens.data_ptr(), hq, hkv, d,
            meta.block_size, meta.max_seq_len, scale, out.data_ptr(), meta.num_seqs, self.parallel,
            threads,
        )  # fmt: skip
        if status != 0:
            raise MemoryError("attention: no memory for the scores")
        return out


def rope_operands(
    q: torch.Tensor, k: torch.Tensor, v: torch.Tensor
) -> tuple[torch.Tensor, tuple[int, int, int]] | None:
    """The fused ``qkv`` rows that q, k and v are views of (as the decoder splits them), with
    (hq, hkv, d); None when they are laid out otherwise."""
    t, hq, d = q.shape
    hkv = k.shape[1]
    size, width = q.element_size(), (hq + 2 * hkv) * d
    if not (q.stride()[1:] == k.stride()[1:] == v.stride()[1:] == (d, 1)):
        return None
    row = q.stride(0) if t > 1 else width  # a single row's stride is its own size
    if t > 1 and not (k.stride(0) == v.stride(0) == row >= width):
        return None
    if k.data_ptr() != q.data_ptr() + hq * d * size:
        return None
    if v.data_ptr() != k.data_ptr() + hkv * d * size:
        return None
    return q.as_strided((t, row), (row, 1)), (hq, hkv, d)


@functools.cache
def _load(isa: str) -> CpuOps | None:
    lib = build.load_library(SOURCE, isa, (*ISA_FLAGS[isa], *OPS_FLAGS))
    attn = build.load_library(ATTENTION, isa, ISA_FLAGS[isa])
    if lib is None or attn is None:
        return None
    i64, ptr, f32 = ctypes.c_int64, ctypes.c_void_p, ctypes.c_float
    lib.kvgate_rms_norm.restype = None
    lib.kvgate_rms_norm.argtypes = [ptr, ptr, ptr, f32, i64, i64, ptr]
    lib.kvgate_silu_mul.restype = None
    lib.kvgate_silu_mul.argtypes = [ptr, i64, i64, ptr]
    lib.kvgate_rope_store_kv.restype = None
    lib.kvgate_rope_store_kv.argtypes = [ptr, i64, i64, i64, i64, i64, ptr, ptr, ptr, ptr, ptr, ptr]
    attn.kvgate_paged_attention.restype = ctypes.c_int
    attn.kvgate_paged_attention.argtypes = [
        ptr, i64, ptr, ptr, ptr, i64, ptr, ptr, i64, i64, i64, i64, i64, f32, ptr, i64, ptr,
        ctypes.c_int,
    ]  # fmt: skip
    attn.kvgate_attention_max_head_dim.restype = ctypes.c_int
    pool = qgemm.load(isa)
    parallel = None if pool is None else pool.parallel_for
    return CpuOps(lib, attn, isa, attn.kvgate_attention_max_head_dim(), parallel)


def load(isa: str | None = None) -> CpuOps | None:
    """The ops for ``isa`` ("avx512" / "avx2"; default: as ``gemm.best_isa`` chooses), or None
    where they cannot run or be built."""
    isa = isa or gemm.best_isa()
    return None if isa is None else _load(isa)


@functools.cache
def default() -> CpuOps | None:
    """``load()``, decided once per process (the dispatcher asks at every op)."""
    return load()
