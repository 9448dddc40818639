"""Building and calling the CPU kernels' C sources: one shared library per source, ISA and
compiler, compiled once into a per-user cache directory (``KVGATE_CACHE_DIR``, default
``~/.cache/kvgate``) and loaded with ctypes, which releases the GIL during each call."""

from __future__ import annotations

import ctypes
import functools
import hashlib
import itertools
import logging
import os
import shutil
import subprocess
import tempfile
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import torch

from engine.config import CACHE_DIR

CFLAGS = ("-O3", "-std=c11", "-shared", "-fPIC", "-pthread")

log = logging.getLogger(__name__)


def cache_dir() -> Path:
    root = os.environ.get(CACHE_DIR.name) or Path.home() / ".cache" / "kvgate"
    return Path(root) / "kernels"


def compiler() -> str | None:
    return shutil.which(os.environ.get("CC", "cc")) or shutil.which("gcc")


def build(source: Path, compiler: str, isa: str, isa_flags: tuple[str, ...]) -> Path:
    """The shared library of ``source`` for ``isa``: cached by the hash of the source, the
    headers beside it (``#include "..."``) and the flags; concurrent builders each publish a
    whole file (atomic rename)."""
    flags = (*CFLAGS, *isa_flags)
    headers = b"".join(h.read_bytes() for h in sorted(source.parent.glob("*.h")))
    key = source.read_bytes() + headers + " ".join((compiler, *flags)).encode()
    digest = hashlib.sha256(key).hexdigest()[:16]
    target = cache_dir() / f"{source.stem}-{isa}-{digest}.so"
    if target.exists():
        return target
    target.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(suffix=".so", dir=target.parent)
    os.close(fd)
    try:
        cmd = [compiler, *flags, "-o", tmp, str(source)]
        subprocess.run(cmd, check=True, capture_output=True, timeout=120)
        os.replace(tmp, target)
    finally:
        if os.path.exists(tmp):
            os.unlink(tmp)
    return target


def load_library(source: Path, isa: str, isa_flags: tuple[str, ...]) -> ctypes.CDLL | None:
    """``source`` built and loaded, or None (with a warning) without a compiler or on a failed
    build."""
    cc = compiler()
    if cc is None:
        log.warning("no C compiler found: %s is not used", source.name)
        return None
    try:
        return ctypes.CDLL(str(build(source, cc, isa, isa_flags)))
    except (OSError, subprocess.SubprocessError) as exc:
        log.warning("building %s failed (%s): its callers fall back", source.name, exc)
        return None


def function_address(lib: ctypes.CDLL, name: str) -> int:
    """The address of ``lib``'s exported function ``name``, for C code that calls it."""
    value = ctypes.cast(lib[name], ctypes.c_void_p).value
    assert value is not None
    return value


def split_panels(call: Callable[[int, int], object], panels: int, macs: int, min_macs: int) -> None:
    """``call(p0, p1)`` over [0, panels): whole panels per thread (no sum is split, so the thread
    count never changes a result), one thread below ``min_macs`` of work."""
    threads = min(torch.get_num_threads(), panels)
    if threads <= 1 or macs < min_macs:
        call(0, panels)
        return
    bounds = [panels * i // threads for i in range(threads + 1)]
    slices = list(itertools.pairwise(bounds))
    pool = _pool(threads)
    futures = [pool.submit(call, a, b) for a, b in slices[1:]]
    call(*slices[0])
    for f in futures:
        f.result()


@functools.cache
def _pool(threads: int) -> ThreadPoolExecutor:
    return ThreadPoolExecutor(threads - 1, thread_name_prefix="kvgate-gemm")
