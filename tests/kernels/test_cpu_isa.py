"""``KVGATE_CPU_ISA``: ``avx2`` holds kvgate's GEMM, torch and oneDNN to AVX2 on any x86 CPU that
has it (an AVX-512 one included), and the model computes the same within tolerance either way."""

from __future__ import annotations

import json
import logging
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from engine.runtime import cpu_isa
from engine.runtime.kernels.cpu import gemm
from tests.engine._logits import LOGITS_ATOL, PROMPT, fresh_engine, generate_with_logits, greedy
from tests.engine._tiny_model import tiny_model_dir

ROOT = Path(__file__).resolve().parents[2]
_ISA_VARS = ("KVGATE_CPU_ISA", "KVGATE_CPU_GEMM", *cpu_isa.TORCH_CAPS)
# What a fresh process reports: kvgate's GEMM build, torch's capability, oneDNN's ISA line.
_PROBE = """
import json, torch
import engine.runtime.model.linear as linear
from engine.runtime.kernels.cpu import gemm
w, x = torch.randn(64, 32), torch.randn(3, 32)
linear._onednn(w, None)(x)  # oneDNN prints its ISA line (ONEDNN_VERBOSE=1) on first use
kernel = gemm.load()
print(json.dumps({"gemm": kernel and kernel.isa, "torch": torch.backends.cpu.get_cpu_capability()}))
"""


FLAGS = cpu_isa.cpu_flags()
HAS_AVX2 = {"avx2", "fma"} <= FLAGS
# torch's AVX512 capability needs these four
HAS_AVX512 = {"avx512f", "avx512bw", "avx512vl", "avx512dq"} <= FLAGS
ONEDNN_AVX512_NAMES = ("AVX-512", "AVX10", "AMX")
needs_avx2 = pytest.mark.skipif(not HAS_AVX2, reason="needs an x86 CPU with AVX2 + FMA (Linux)")


def _clean_env(**extra: str) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if k not in _ISA_VARS}
    return {**env, **extra}


def _probe(env: dict[str, str]) -> tuple[dict[str, str | None], str]:
    done = subprocess.run(
        [sys.executable, "-c", _PROBE], cwd=ROOT, env={**env, "ONEDNN_VERBOSE": "1"},
        capture_output=True, text=True, timeout=300, check=True,
    )  # fmt: skip
    lines = done.stdout.splitlines()
    if json.loads(lines[-1])["gemm"] is None:
        pytest.skip("no C compiler: kvgate's GEMM is not built")
    isa_lines = [line for line in lines if ",cpu,isa:" in line]
    assert len(isa_lines) == 1, done.stdout[-2000:]
    return json.loads(lines[-1]), isa_lines[0]


@needs_avx2
def test_avx2_holds_the_gemm_torch_and_onednn_to_avx2() -> None:
    got, onednn = _probe(_clean_env(KVGATE_CPU_ISA="avx2"))
    assert got == {"gemm": "avx2", "torch": "AVX2"}
    assert onednn.endswith("isa:Intel AVX2"), onednn


@needs_avx2
def test_without_the_setting_the_best_build_of_this_cpu_is_used() -> None:
    got, onednn = _probe(_clean_env())
    best = "avx512" if HAS_AVX512 else "avx2"
    assert got == {"gemm": best, "torch": best.upper()}
    # oneDNN names AVX-512 hosts by their newest extension ("AVX-512 ...", "AVX10.1", "AMX")
    assert any(name in onednn for name in ONEDNN_AVX512_NAMES) == HAS_AVX512, onednn


@needs_avx2
def test_the_model_agrees_within_tolerance_under_either_isa(tmp_path: Path) -> None:
    out = tmp_path / "avx2.pt"
    model = tiny_model_dir()
    subprocess.run(
        [sys.executable, "-m", "tests.engine._logits", str(model), str(out)],
        cwd=ROOT, env=_clean_env(KVGATE_CPU_ISA="avx2"), check=True, timeout=300,
    )  # fmt: skip
    avx2 = torch.load(out)
    assert (avx2["torch_isa"], avx2["gemm_isa"]) == ("AVX2", "avx2")
    ((here, logits),) = generate_with_logits(fresh_engine(model), [PROMPT], greedy())
    assert avx2["tokens"] == list(here.token_ids)
    torch.testing.assert_close(avx2["logits"], logits, rtol=0, atol=LOGITS_ATOL)


CPUINFO = """processor\t: 0
vendor_id\t: {vendor}
flags\t\t: fpu sse2 avx avx2 fma {extra}

processor\t: 1
flags\t\t: fpu
"""
ZEN4 = "avx512f avx512bw avx512vl avx512dq avx512_bf16 avx512_vnni"
SAPPHIRE_RAPIDS = f"{ZEN4} amx_tile amx_bf16 amx_int8"


def _flags(tmp_path: Path, extra: str, vendor: str = "AuthenticAMD") -> frozenset[str]:
    path = tmp_path / "cpuinfo"
    path.write_text(CPUINFO.format(vendor=vendor, extra=extra))
    return cpu_isa.read_flags(path)


def test_bf16_units_are_read_from_the_first_processors_flags(tmp_path: Path) -> None:
    assert cpu_isa.bf16_units(_flags(tmp_path, "")) is None  # AVX2 + FMA alone
    assert cpu_isa.bf16_units(_flags(tmp_path, "avx512f avx512bw avx512vl avx512dq")) is None
    assert cpu_isa.bf16_units(_flags(tmp_path, ZEN4)) == "avx512_bf16"
    assert cpu_isa.bf16_units(_flags(tmp_path, SAPPHIRE_RAPIDS, "GenuineIntel")) == "amx"
    # the tile flag without bf16 tiles (an AMX-INT8-only part) is not bf16 units
    assert cpu_isa.bf16_units(_flags(tmp_path, "avx512f amx_tile amx_int8")) is None
    assert cpu_isa.read_flags(tmp_path / "missing") == frozenset()
    flags = _flags(tmp_path, SAPPHIRE_RAPIDS)
    assert cpu_isa.vector_flags(flags)[:3] == ["amx_bf16", "amx_int8", "amx_tile"]
    assert "sse2" not in cpu_isa.vector_flags(flags)


def test_native_bf16_is_off_under_avx2_and_follows_the_flags_otherwise(tmp_path: Path) -> None:
    amx = _flags(tmp_path, SAPPHIRE_RAPIDS)
    assert cpu_isa.native_bf16({}, amx) == "amx"
    assert cpu_isa.native_bf16({"KVGATE_CPU_ISA": "auto"}, amx) == "amx"
    assert cpu_isa.native_bf16({"KVGATE_CPU_ISA": "avx2"}, amx) is None
    assert cpu_isa.native_bf16({}, _flags(tmp_path, "")) is None
    # this host, as the engine sees it
    assert cpu_isa.native_bf16() == (
        None if cpu_isa.requested() == "avx2" else cpu_isa.bf16_units(FLAGS)
    )


def test_the_setting_is_validated_and_exports_the_torch_caps() -> None:
    assert cpu_isa.requested({}) == "auto"
    assert cpu_isa.requested({"KVGATE_CPU_ISA": " AVX2 "}) == "avx2"
    with pytest.raises(ValueError, match="KVGATE_CPU_ISA must be one of auto, avx2, got 'sse'"):
        cpu_isa.requested({"KVGATE_CPU_ISA": "sse"})
    env = {"KVGATE_CPU_ISA": "avx2", "ONEDNN_MAX_CPU_ISA": "AVX512_CORE"}
    cpu_isa.export_torch_caps(env)  # an explicit value of torch's variables is kept
    assert env["ATEN_CPU_CAPABILITY"] == "avx2" and env["ONEDNN_MAX_CPU_ISA"] == "AVX512_CORE"
    for value in ("auto", "sse"):
        untouched = {"KVGATE_CPU_ISA": value}
        cpu_isa.export_torch_caps(untouched)
        assert untouched == {"KVGATE_CPU_ISA": value}


@needs_avx2
def test_in_a_process_whose_torch_kept_avx512_the_gemm_still_takes_avx2(
    monkeypatch: pytest.MonkeyPatch, fresh_build: Path, caplog: pytest.LogCaptureFixture
) -> None:
    monkeypatch.setenv("KVGATE_CPU_ISA", "avx2")
    with caplog.at_level(logging.WARNING, logger=gemm.__name__):
        kernel = gemm.load()
    if kernel is None:
        pytest.skip("no C compiler")
    assert kernel.isa == "avx2"
    uncapped = torch.backends.cpu.get_cpu_capability() == "AVX512"
    assert ("still dispatches AVX-512" in caplog.text) == uncapped


def test_a_bad_setting_fails_loading_with_the_variable_named(
    monkeypatch: pytest.MonkeyPatch, fresh_build: Path
) -> None:
    monkeypatch.setenv("KVGATE_CPU_ISA", "avx9")
    with pytest.raises(ValueError, match="KVGATE_CPU_ISA"):
        gemm.load()
