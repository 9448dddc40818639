"""Shared plumbing of the Triton kernels: launches, argument checks, tile configuration.

Kernels are plain ``@triton.jit`` functions. Triton decides at decoration time whether a kernel
is compiled or interpreted (``TRITON_INTERPRET=1``, read through ``triton.knobs``), and so does
its standard library (``tl.max``, ``tl.sum``): the flag must be set before ``triton`` is first
imported (tests do it in ``tests/kernels/conftest.py``; ``python -m bench.kernels --dry-run``
before its first import of the kernels).

Every launch goes through :func:`launch`, which can record the kernel *variant* it needs (what
Triton keys its compile cache on: the constexprs, launch options, argument dtypes and pointer
alignment; runtime integers are ``do_not_specialize`` so their values never add variants).
``engine/runtime/warmup.py`` launches every variant a model geometry can reach before the engine
reports ready; ``VARIANTS`` (recording when ``VARIANTS.recording`` is set: the kernel tests do,
serving does not, the key costs microseconds per launch) lets tests under the interpreter, where
nothing compiles, check that a workload after warm-up needs no new variant.

The ``@triton.jit`` kernels are the one untyped code the type checker meets (each carries
``# type: ignore[untyped-decorator]`` and ``[no-untyped-def]``): Triton ships no type
information, and a kernel parameter's annotation is a Triton type (``int`` would make it i32,
``float`` fp32, changing what Triton specializes), so parameters stay bare or ``tl.constexpr``.
The Python wrappers around them are fully typed.
"""

from __future__ import annotations

import functools
from collections.abc import Hashable, Sequence
from typing import Any, NamedTuple

import torch
import triton

from engine.runtime.kernels.metadata import AttentionMetadata

SUPPORTED_DTYPES = (torch.float16, torch.bfloat16, torch.float32)
INT32_MAX = 2**31 - 1

VariantKey = tuple[Hashable, ...]


class VariantLog:
    """The kernel variants launched in this process (a model of Triton's compile cache)."""

    def __init__(self) -> None:
        self.seen: set[VariantKey] = set()
        self.recording = False

    def note(self, key: VariantKey) -> bool:
        """Record ``key``; True when it is new (Triton would compile it now)."""
        if key in self.seen:
            return False
        self.seen.add(key)
        return True

    def __len__(self) -> int:
        return len(self.seen)


VARIANTS = VariantLog()


def _declared(kernel: Any, option: str) -> set[str]:
    """Argument names of a ``triton.jit`` option (``do_not_specialize``, ...), compiled or
    interpreted kernel alike."""
    names = getattr(kernel, option, None)
    if names is None:  # an InterpretedFunction keeps the decorator's keywords
        names = getattr(kernel, "kwargs", {}).get(option)
    return {n for n in names or () if isinstance(n, str)}


def _arg_signature(arg: Any, specialize: bool, align: bool) -> Hashable:
    """What Triton's specialization sees of one argument."""
    if isinstance(arg, torch.Tensor):
        return (arg.dtype, arg.data_ptr() % 16 == 0) if align else arg.dtype
    if isinstance(arg, bool):
        return ("bool", arg)
    if isinstance(arg, int):
        width = "i32" if -INT32_MAX - 1 <= arg <= INT32_MAX else "i64"
        return (width, arg == 1, arg % 16 == 0) if specialize else width
    return type(arg).__name__


def variant_key(
    kernel: Any, args: Sequence[Any], constexprs: dict[str, Any], num_warps: int, num_stages: int
) -> VariantKey:
    fixed = _declared(kernel, "do_not_specialize")
    any_alignment = _declared(kernel, "do_not_specialize_on_alignment")
    sig = tuple(
        _arg_signature(a, n not in fixed, n not in any_alignment)
        for n, a in zip(kernel.arg_names, args, strict=False)
    )
    consts = tuple(sorted((k, str(v)) for k, v in constexprs.items()))
    return (kernel.__name__, consts, sig, num_warps, num_stages)


def launch(
    kernel: Any,
    grid: tuple[int, ...],
    args: Sequence[Any],
    *,
    num_warps: int = 4,
    num_stages: int = 3,
    **constexprs: Any,
) -> None:
    """``kernel[grid](*args, **constexprs)``, recording the variant it needs when asked."""
    if VARIANTS.recording:
        VARIANTS.note(variant_key(kernel, args, constexprs, num_warps, num_stages))
    kernel[grid](*args, **constexprs, num_warps=num_warps, num_stages=num_stages)


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
    ds = meta.decode_seqs
    if ds is not None and (ds.dtype != torch.int32 or ds.dim() != 1 or not ds.is_contiguous()):
        raise ValueError(
            f"meta.decode_seqs must be contiguous int32 [n], got {ds.dtype} {ds.shape}"
        )
    check_device(k_cache, meta.query_start_loc, meta.context_lens, meta.seq_lens, bt)


def check_attention(
    q: torch.Tensor, k_cache: torch.Tensor, v_cache: torch.Tensor, meta: AttentionMetadata
) -> None:
    """Every argument check of an attention op, skipped when the step was validated once
    (``meta.checked``: q's geometry is the model's, the same in every layer)."""
    if meta.checked:
        return
    check_kv_cache(k_cache, v_cache)
    check_query(q, k_cache)
    check_metadata(meta, k_cache, q.shape[0])


def num_sms(device: torch.device) -> int:
    """Streaming multiprocessors of ``device`` (a small fixed count under the interpreter)."""
    if device.type == "cuda":
        index = device.index if device.index is not None else torch.cuda.current_device()
        return _cuda_sms(index)
    return 4


@functools.cache
def _cuda_sms(index: int) -> int:
    return int(torch.cuda.get_device_properties(index).multi_processor_count)
