from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def test_kernels_compile_for_sm90_without_register_spills():
    # a fresh process without TRITON_INTERPRET: Triton decorates its own standard library for
    # the mode active when it is first imported, so compiling needs a non-interpreter process
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    env.setdefault("TRITON_DEFAULT_FP_FUSION", "1")
    env["PYTHONPATH"] = str(ROOT)
    proc = subprocess.run(
        [sys.executable, "-m", "tests.kernels.sm90_compile"], env=env, cwd=ROOT,
        capture_output=True, text=True, timeout=300,
    )  # fmt: skip
    assert proc.returncode == 0, proc.stderr[-3000:]
    usage = json.loads(proc.stdout.strip().splitlines()[-1])
    assert set(usage) == {
        "extend_d64_m128", "extend_d128_m128", "extend_d128_m64", "extend_d128_m16",
        "split_kv_d64_m16", "split_kv_d128_m16_direct",
        "split_kv_d128_m128", "split_kv_d128_m16_merge", "split_kv_d128_m16_indexed", "merge",
        "store_kv", "rms_norm", "rope_store_kv",
    }  # fmt: skip
    for name, res in usage.items():
        assert res["STACK"] == 0 and res["LOCAL"] == 0, (name, res)  # no spills
        assert res["REG"] <= 255, (name, res)
        assert res["SHARED"] + res["DYNAMIC_SHARED"] <= 227 * 1024, (name, res)
