"""Shared plumbing of the Triton kernels: lazy JIT, argument checks, tile configuration.

Why kernels are compiled lazily: ``triton.jit`` decides at *decoration* time whether a function
becomes a compiled ``JITFunction`` or an ``InterpretedFunction`` (it reads ``TRITON_INTERPRET``
through ``triton.knobs.runtime.interpret``). Decorating at import would freeze that choice at
whatever moment this package happened to be imported. ``lazy_jit`` applies ``triton.jit`` on the
first launch instead, once per mode, so setting ``TRITON_INTERPRET=1`` any time before the first
launch (for example in a test ``conftest.py``) is enough, whatever the import order.

Triton's own library functions are ``@jit`` functions too (``tl.max``, ``tl.sum``, ``tl.zeros`` in
``triton.language.standard``), decorated once, for the mode active when ``triton`` is first
imported; an interpreted kernel calling a compiled one fails. So kernels call no ``@jit`` function:
they use builtins (``tl.full``) and ``tl.reduce`` with the standard combine functions ``MAX`` and
``SUM``, which the interpreter maps to numpy by identity (whichever mode they were decorated for)
and the compiler inlines. Compiling still needs ``triton`` imported without the interpreter.
"""

from __future__ import annotations

import functools
from collections.abc import Callable
from typing import Any, NamedTuple

import torch
import triton
import triton.language as tl

from engine.kernels.metadata import AttentionMetadata

SUPPORTED_DTYPES = (torch.float16, torch.bfloat16, torch.float32)

# combine functions for tl.reduce (row max / row sum); see the module docstring
MAX = tl.standard._elementwise_max
SUM = tl.standard._sum_combine


class Tiles(NamedTuple):
    """Launch shape of an attention kernel: query rows x keys per tile, warps, pipeline stages."""

    block_m: int
    block_n: int
    num_warps: int
    num_stages: int


# small tiles under the interpreter: its cost is per operation, and several tiles per request
# exercise the loops and masks the way long sequences do on a GPU
INTERPRETER_TILES = Tiles(16, 16, 4, 1)


def interpreting() -> bool:
    """True when Triton runs kernels with its CPU interpreter (``TRITON_INTERPRET=1``)."""
    return bool(triton.knobs.runtime.interpret)


class LazyKernel:
    """A Triton kernel that is decorated with ``triton.jit`` on first launch, once per mode."""

    def __init__(self, fn: Callable[..., None]) -> None:
        self.fn = fn
        self._built: dict[bool, Any] = {}

    def __getitem__(self, grid: tuple[int, ...]) -> Callable[..., Any]:
        mode = interpreting()
        kernel = self._built.get(mode)
        if kernel is None:
            kernel = triton.jit(self.fn)
            self._built[mode] = kernel
        return kernel[grid]


def lazy_jit(fn: Callable[..., None]) -> LazyKernel:
    return LazyKernel(fn)


def next_pow2(n: int) -> int:
    return 1 << max(0, int(n) - 1).bit_length()


def dot_options(dtype: torch.dtype) -> tuple[str, bool]:
    """(input_precision, upcast) for ``tl.dot`` on ``dtype`` inputs.

    fp32 uses exact ("ieee") products, not TF32, so fp32 results match an fp32 reference.
    ``upcast``: the Triton 3.9 interpreter computes ``tl.dot`` of bfloat16 operands wrongly, so
    under the interpreter bf16 tiles are widened to fp32 before each dot (never on a GPU).
    """
    if dtype == torch.float32:
        return "ieee", False
    return "tf32", dtype == torch.bfloat16 and interpreting()


def check_device(*tensors: torch.Tensor) -> None:
    device = tensors[0].device
    if device.type != "cuda" and not interpreting():
        raise ValueError(
            f"Triton kernels need CUDA tensors (got {device}); set TRITON_INTERPRET=1 to run "
            "them on the CPU with the interpreter"
        )
    for t in tensors[1:]:
        if t.device != device:
            raise ValueError(f"all tensors must be on {device}, found one on {t.device}")


def check_kv_cache(k_cache: torch.Tensor, v_cache: torch.Tensor) -> None:
    """k_cache/v_cache: [num_blocks, block_size, num_kv_heads, head_dim], same shape and dtype."""
    if k_cache.dim() != 4 or k_cache.shape != v_cache.shape:
        raise ValueError(
            "k_cache and v_cache must both be [num_blocks, block_size, num_kv_heads, head_dim], "
            f"got {tuple(k_cache.shape)} and {tuple(v_cache.shape)}"
        )
    if k_cache.dtype != v_cache.dtype or k_cache.dtype not in SUPPORTED_DTYPES:
        raise ValueError(
            f"caches must share one dtype of {SUPPORTED_DTYPES}, "
            f"got {k_cache.dtype}/{v_cache.dtype}"
        )
    block_size, head_dim = int(k_cache.shape[1]), int(k_cache.shape[3])
    if block_size < 1 or block_size > 64 or block_size & (block_size - 1):
        raise ValueError(f"block_size must be a power of two in 1..64, got {block_size}")
    if head_dim < 16 or head_dim > 256 or head_dim & (head_dim - 1):
        raise ValueError(f"head_dim must be a power of two in 16..256, got {head_dim}")
    if k_cache.stride(3) != 1 or v_cache.stride(3) != 1:
        raise ValueError("k_cache and v_cache need a contiguous last (head_dim) dimension")


def check_query(q: torch.Tensor, k_cache: torch.Tensor) -> int:
    """q: [T, Hq, D] matching the cache; returns the GQA group size Hq // Hkv."""
    if q.dim() != 3:
        raise ValueError(f"q must be [num_tokens, num_heads, head_dim], got {tuple(q.shape)}")
    if q.dtype != k_cache.dtype:
        raise ValueError(f"q dtype {q.dtype} differs from the cache dtype {k_cache.dtype}")
    if q.shape[2] != k_cache.shape[3]:
        raise ValueError(f"q head_dim {q.shape[2]} differs from the cache's {k_cache.shape[3]}")
    if q.stride(2) != 1:
        raise ValueError("q needs a contiguous last (head_dim) dimension")
    num_heads, num_kv_heads = int(q.shape[1]), int(k_cache.shape[2])
    if num_heads % num_kv_heads:
        raise ValueError(f"num_heads {num_heads} is not a multiple of num_kv_heads {num_kv_heads}")
    return num_heads // num_kv_heads


def check_metadata(meta: AttentionMetadata, k_cache: torch.Tensor, num_tokens: int) -> None:
    """Dtypes, shapes and devices of the metadata tensors (no device sync: values are trusted)."""
    if meta.block_size != k_cache.shape[1]:
        raise ValueError(
            f"meta.block_size {meta.block_size} != cache block size {k_cache.shape[1]}"
        )
    b = meta.num_seqs
    expected = {
        "query_start_loc": (meta.query_start_loc, (b + 1,)),
        "context_lens": (meta.context_lens, (b,)),
        "seq_lens": (meta.seq_lens, (b,)),
    }
    for name, (t, shape) in expected.items():
        if t.dtype != torch.int32 or tuple(t.shape) != shape or not t.is_contiguous():
            raise ValueError(
                f"meta.{name} must be contiguous int32 {shape}, got {t.dtype} {t.shape}"
            )
    bt = meta.block_tables
    if bt.dtype != torch.int32 or bt.dim() != 2 or bt.shape[0] != b or bt.stride(1) != 1:
        raise ValueError(
            f"meta.block_tables must be int32 [{b}, max_blocks] with unit column stride"
        )
    if bt.shape[1] * meta.block_size < meta.max_seq_len:
        raise ValueError("meta.block_tables has too few columns for meta.max_seq_len")
    if meta.max_query_len < 0 or meta.max_query_len > num_tokens:
        raise ValueError(f"meta.max_query_len {meta.max_query_len} is not in 0..{num_tokens}")
    if meta.num_shared_blocks < 0 or meta.num_shared_blocks > bt.shape[1]:
        raise ValueError(f"meta.num_shared_blocks {meta.num_shared_blocks} out of range")
    check_device(k_cache, meta.query_start_loc, meta.context_lens, meta.seq_lens, bt)


def num_sms(device: torch.device) -> int:
    """Streaming multiprocessors of ``device`` (a small fixed count under the interpreter)."""
    if device.type == "cuda":
        index = device.index if device.index is not None else torch.cuda.current_device()
        return _cuda_sms(index)
    return 4


@functools.cache
def _cuda_sms(index: int) -> int:
    return int(torch.cuda.get_device_properties(index).multi_processor_count)
