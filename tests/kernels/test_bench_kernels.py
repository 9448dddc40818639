from __future__ import annotations

import json
import os
import sys

import pytest

from bench.kernels import main
from tests.kernels.conftest import HAS_CUDA


@pytest.mark.skipif(HAS_CUDA, reason="the dry run interprets; this process compiled Triton")
def test_bench_kernels_dry_run_writes_results(tmp_path):
    out = tmp_path / "kernels.json"
    assert main(["--dry-run", "--out", str(out)]) == 0
    result = json.loads(out.read_text())
    assert result["dry_run"] is True
    assert result["config"]["dtype"] == "float32"
    tiny = result["results"]["tiny"]
    # the timed kernels computed the right thing (fp32 under the interpreter)
    assert tiny["prefill"]["max_abs_diff_vs_sdpa"] < 1e-4
    assert tiny["cascade"]["max_abs_diff_vs_decode"] < 1e-5
    for key in ("kvgate_us", "sdpa_us", "ratio_vs_sdpa"):
        assert tiny["prefill"][key]["min"] <= tiny["prefill"][key]["median"]
    assert tiny["decode"]["kv_bytes"] == 2 * 2 * 25 * 2 * 32 * 4
    assert tiny["cascade"]["speedup"]["median"] > 0


def test_tile_sweep_patches_and_restores_the_tile_choice():
    from bench.kernel_tiles import (
        DECODE_CANDIDATES,
        PREFILL_CANDIDATES,
        sweep_decode,
        sweep_prefill,
    )
    from engine.runtime.kernels.triton import decode, prefill

    original_prefill, original_decode = prefill.gpu_tiles, decode.gpu_tiles
    seen = []
    rows = sweep_prefill(64, lambda: seen.append(prefill.gpu_tiles(64, 2048)) or [3.0, 1.0, 2.0])
    assert seen == PREFILL_CANDIDATES[64]
    assert [r["us"] for r in rows] == [2.0] * len(seen)
    assert prefill.gpu_tiles is original_prefill

    def failing() -> list[float]:
        tiles = decode.gpu_tiles(128, 7)
        assert tiles.block_m == 16  # the GQA group of 7, padded to the MMA minimum
        raise RuntimeError(f"out of resources at block_n={tiles.block_n}")

    rows = sweep_decode(failing)
    assert [r["error"] for r in rows] == [
        f"RuntimeError: out of resources at block_n={bn}" for bn, _ in DECODE_CANDIDATES
    ]
    assert decode.gpu_tiles is original_decode


def test_gpu_check_script_dry_run_writes_both_results(tmp_path):
    import subprocess
    from pathlib import Path

    root = Path(__file__).resolve().parents[2]
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    env.update(OUT=str(tmp_path), PYTHON=sys.executable, CUDA_VISIBLE_DEVICES="")
    proc = subprocess.run(
        ["bash", str(root / "bench" / "gpu_check.sh"), "--dry-run"], env=env, cwd=root,
        capture_output=True, text=True, timeout=300,
    )  # fmt: skip
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    kernels = json.loads((tmp_path / "kernels.json").read_text())
    engine = json.loads((tmp_path / "engine.json").read_text())
    assert kernels["dry_run"] is True and engine["dry_run"] is True
    assert engine["parity"]["top1_agreement"] == 1.0  # float32 on the CPU: HF's logits
    assert engine["parity"]["max_abs_diff"] < 1e-4
    for section in ("startup", "prefill", "decode", "burst"):
        assert engine[section], section
    assert engine["decode"]["batch_1"]["eager_tokens_per_s"] > 0
