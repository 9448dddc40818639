"""Kernel tests run on CUDA when present, else on the CPU through Triton's interpreter.

Triton fixes the mode (compiled or interpreted) when a kernel or its own standard library is
decorated, i.e. at import: ``TRITON_INTERPRET`` is set here, before any module of this package
imports ``triton``. If something imported ``triton`` earlier in compiled mode on a machine without
CUDA, the run stops with a message instead of failing every kernel test obscurely.
"""

from __future__ import annotations

import os
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest
import torch

HAS_CUDA = torch.cuda.is_available()

if not HAS_CUDA:
    if "triton" in sys.modules and os.environ.get("TRITON_INTERPRET") != "1":
        raise pytest.UsageError(
            "triton was imported before tests/kernels/conftest.py set TRITON_INTERPRET=1; "
            "run with TRITON_INTERPRET=1 in the environment"
        )
    os.environ["TRITON_INTERPRET"] = "1"


def pytest_runtest_setup(item: pytest.Item) -> None:
    if item.get_closest_marker("gpu") is not None and not HAS_CUDA:
        pytest.skip("needs a CUDA device")


@pytest.fixture(autouse=True)
def record_kernel_variants(monkeypatch: pytest.MonkeyPatch) -> None:
    """Kernel tests record every launched variant (``VARIANTS``; off when serving)."""
    from engine.runtime.kernels.triton import VARIANTS  # after TRITON_INTERPRET is settled above

    monkeypatch.setattr(VARIANTS, "recording", True)


@pytest.fixture
def fresh_build(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> Iterator[Path]:
    """The CPU GEMM built anew into an empty cache directory (and loaded anew afterwards)."""
    from engine.runtime.kernels.cpu import gemm

    monkeypatch.setenv("KVGATE_CACHE_DIR", str(tmp_path))
    gemm._load.cache_clear()
    gemm._warn_torch_not_capped.cache_clear()
    yield tmp_path
    monkeypatch.undo()
    gemm._load.cache_clear()


@pytest.fixture
def device() -> torch.device:
    return torch.device("cuda" if HAS_CUDA else "cpu")
