"""The engine's device and dtype: which GPU, bound to which thread, in which precision.

CUDA keeps a *current device* per host thread, and Triton launches on the current device of the
launching thread (not on the device of the tensors). The engine loads on one thread and steps on
another (``AsyncEngine``'s), so the runner binds its device at load and again at every step:
``KVGATE_DEVICE=cuda:1`` must never launch kernels on GPU 0.
"""

from __future__ import annotations

import logging
from collections.abc import Callable

import torch

from engine.runtime import cpu_isa

log = logging.getLogger(__name__)


def resolve_device(name: str) -> torch.device:
    """``auto`` -> CUDA when available else CPU; ``cuda`` gets an explicit index (the current
    device of this thread), so later comparisons with ``torch.cuda.current_device()`` hold."""
    if name == "auto":
        name = "cuda" if torch.cuda.is_available() else "cpu"
    device = torch.device(name)
    if device.type == "cuda" and device.index is None:
        device = torch.device("cuda", torch.cuda.current_device())
    return device


def bind_device(
    device: torch.device,
    *,
    current: Callable[[], int] | None = None,
    set_device: Callable[[torch.device], None] | None = None,
) -> bool:
    """Make ``device`` the calling thread's current CUDA device; True when it had to change.
    A no-op for CPU devices (``current``/``set_device`` are injectable for tests)."""
    if device.type != "cuda":
        return False
    current = current or torch.cuda.current_device
    if current() == device.index:
        return False
    (set_device or torch.cuda.set_device)(device)
    return True


def choose_dtype(
    requested: str,
    device: torch.device,
    *,
    gguf: bool = False,
    bf16_supported: Callable[[], bool] | None = None,
) -> str:
    """EngineConfig.dtype for loading. ``auto``: on CUDA bfloat16, or float16 on GPUs without
    bfloat16 (before Ampere); on the CPU bfloat16 where the CPU has bf16 matrix units (AMX-BF16
    or AVX512_BF16: ``cpu_isa.native_bf16``), else float32, whatever dtype the checkpoint was
    saved in; a GGUF file stays ``auto`` (its Q4_1 / Q8_0 blocks keep their own kernels, the
    rest is float32). ``bf16_supported`` is injectable for tests."""
    if requested != "auto":
        return requested
    if device.type == "cuda":
        supported = bf16_supported or torch.cuda.is_bf16_supported
        return "bfloat16" if supported() else "float16"
    if gguf:
        return "auto"
    supported = bf16_supported or (lambda: cpu_isa.native_bf16() is not None)
    return "bfloat16" if supported() else "float32"


def choose_kv_dtype(requested: str, weights: torch.dtype, device: torch.device) -> torch.dtype:
    """EngineConfig.kv_dtype -> the dtype of the KV cache, attention, norms and the residual
    stream. ``auto``: float32 on the CPU (bf16 weights meet float32 activations in their linears,
    and everything between the linears runs on kvgate's float32 C kernels: the same bits on any
    thread count), the weights' dtype on CUDA. ValueError for float32 beside half weights on
    CUDA (its kernels take one dtype) or for a half dtype other than the weights'."""
    if requested == "auto":
        return torch.float32 if device.type == "cpu" else weights
    chosen: torch.dtype = getattr(torch, requested)
    if chosen == weights or (chosen == torch.float32 and device.type == "cpu"):
        return chosen
    raise ValueError(
        f"kv_dtype {requested} beside {_name(weights)} weights: use auto, {_name(weights)}"
        + (", or float32" if device.type == "cpu" else "")
    )


def describe(
    device: torch.device,
    dtype: torch.dtype,
    requested: str,
    kv_dtype: torch.dtype | None = None,
    *,
    gguf: bool = False,
) -> str:
    """One start-up line: device (GPU name and memory), dtype and why, and the KV cache's dtype
    where it is another (the CPU's float32 attention beside bf16 linears)."""
    where = str(device)
    if device.type == "cuda":
        props = torch.cuda.get_device_properties(device)
        where = f"{device} ({props.name}, {props.total_memory / 2**30:.0f} GiB)"
    if requested != "auto":
        how = "configured"
    elif device.type == "cuda":
        how = "auto: bfloat16 on CUDA, float16 without bf16"
    elif gguf:
        how = "auto: a GGUF keeps its blocks' kernels, float32 beside them"
    else:
        units = cpu_isa.native_bf16()
        how = f"auto: bf16 units {units}" if units else "auto: no bf16 units on this CPU"
    line = f"engine device {where}, dtype {_name(dtype)} ({how})"
    if kv_dtype is not None and kv_dtype != dtype:
        line += f", KV cache and attention {_name(kv_dtype)}"
    return line


def _name(dtype: torch.dtype) -> str:
    return str(dtype).removeprefix("torch.")


def _glibc(symbol: str) -> Callable[..., object] | None:
    """The C library's ``symbol``; None where there is none (not glibc)."""
    import ctypes
    import ctypes.util

    name = ctypes.util.find_library("c")
    if name is None:
        return None
    try:
        fn: Callable[..., object] = getattr(ctypes.CDLL(name), symbol)
    except (OSError, AttributeError):
        return None
    return fn


def release_freed_heap() -> None:
    """Hand the heap pages that loading freed back to the OS: glibc keeps a process's freed
    memory for reuse, and loading a GGUF frees several times the model's size in temporaries
    (SmolLM2-135M: 316 MB resident after loading, 183 MB after this). Elsewhere a no-op."""
    import gc

    trim = _glibc("malloc_trim")
    if trim is not None:
        gc.collect()
        trim(0)


# glibc's mallopt parameters (malloc.h)
_M_TRIM_THRESHOLD, _M_MMAP_THRESHOLD, _M_ARENA_MAX = -1, -3, -8
KEEP_FREED_BYTES = 1 << 30  # freed blocks up to this size stay in the heap for reuse


def keep_freed_heap() -> None:
    """Serve the CPU engine's step tensors from memory it freed, not from fresh pages: glibc
    maps an allocation above its mmap threshold (at most 32 MB) anew each time and unmaps it on
    free, so every prefill step faulted in and zeroed its large activations again (a 2688-token
    step of the 0.5B geometry: 105 MB for gate/up, every layer; 17% of its CPU time was page
    faults). This keeps freed blocks up to ``KEEP_FREED_BYTES`` in the heap (a long prefill's
    peak stays resident) and puts every thread on one arena (another thread's arena holds at
    most 64 MB, so the engine thread's large blocks would be mapped anyway); a 2688-token step
    took 20-27% less time, a 16-request burst 13-20% less. Elsewhere a no-op."""
    mallopt = _glibc("mallopt")
    if mallopt is None:
        return
    for param, value in (
        (_M_MMAP_THRESHOLD, KEEP_FREED_BYTES),
        (_M_TRIM_THRESHOLD, KEEP_FREED_BYTES),
        (_M_ARENA_MAX, 1),
    ):
        mallopt(param, value)
