"""Kernel tests run on CUDA when present, else on the CPU through Triton's interpreter.

Triton reads TRITON_INTERPRET when a kernel is decorated; engine.kernels.triton decorates on first
launch (see engine/kernels/triton/_common.py), so setting it here, before any test launches a
kernel, works whatever was imported earlier.
"""

from __future__ import annotations

import os

import pytest
import torch

HAS_CUDA = torch.cuda.is_available()

if not HAS_CUDA:
    os.environ.setdefault("TRITON_INTERPRET", "1")


def pytest_runtest_setup(item: pytest.Item) -> None:
    if item.get_closest_marker("gpu") is not None and not HAS_CUDA:
        pytest.skip("needs a CUDA device")


@pytest.fixture
def device() -> torch.device:
    return torch.device("cuda" if HAS_CUDA else "cpu")
