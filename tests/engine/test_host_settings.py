"""The CPU engine's process settings: OpenMP's wait policy and the heap's reuse of freed blocks."""

from __future__ import annotations

import ctypes.util
import os
import subprocess
import sys

import pytest

from engine.runtime import omp_policy

# A fresh interpreter: allocate, touch and free a 105 MB tensor (above glibc's largest mmap
# threshold, 32 MB) a few times, then print the page faults per round of a few more.
_FAULTS = """
import resource, sys, torch
from engine.runtime.device import keep_freed_heap
if sys.argv[1] == "keep":
    keep_freed_heap()
def rounds(n):
    before = resource.getrusage(resource.RUSAGE_SELF).ru_minflt
    for _ in range(n):
        x = torch.empty(105 << 18)
        x.fill_(1.0)
        del x
    return (resource.getrusage(resource.RUSAGE_SELF).ru_minflt - before) / n
rounds(12)
print(rounds(5))
"""
_PAGES = (105 << 20) // 4096


def _faults_per_round(mode: str) -> float:
    done = subprocess.run(
        [sys.executable, "-c", _FAULTS, mode], capture_output=True, text=True, check=True
    )
    return float(done.stdout.strip().splitlines()[-1])


@pytest.mark.skipif(
    not sys.platform.startswith("linux") or ctypes.util.find_library("c") is None,
    reason="glibc's mallopt",
)
def test_freed_step_tensors_are_reused_without_page_faults() -> None:
    assert _faults_per_round("default") > _PAGES / 2  # mapped anew each time, as glibc does
    assert _faults_per_round("keep") < _PAGES / 20  # the freed block, already resident


def test_the_wait_policy_is_set_unless_the_process_chose_one() -> None:
    unset: dict[str, str] = {}
    omp_policy.export(unset)
    assert unset == {"OMP_WAIT_POLICY": "PASSIVE"}
    chosen = {"OMP_WAIT_POLICY": "ACTIVE"}
    omp_policy.export(chosen)
    assert chosen == {"OMP_WAIT_POLICY": "ACTIVE"}


def test_importing_engine_exports_it_and_other_programs_do_not_inherit_it() -> None:
    env = {k: v for k, v in os.environ.items() if k != "OMP_WAIT_POLICY"}
    script = (
        "import json, os, engine\n"
        "from engine.runtime import omp_policy\n"
        "print(json.dumps([os.environ.get('OMP_WAIT_POLICY'),"
        " omp_policy.foreign_environ().get('OMP_WAIT_POLICY')]))"
    )
    run = [sys.executable, "-c", script]
    out = subprocess.run(run, capture_output=True, text=True, check=True, env=env).stdout
    assert out.strip() == '["PASSIVE", null]'
    env["OMP_WAIT_POLICY"] = "ACTIVE"  # the operator's choice is kept, for children too
    out = subprocess.run(run, capture_output=True, text=True, check=True, env=env).stdout
    assert out.strip() == '["ACTIVE", "ACTIVE"]'
