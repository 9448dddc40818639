from __future__ import annotations

import json
import os

from bench.kernels import main


def test_bench_kernels_dry_run_writes_results(tmp_path):
    before = os.environ.get("TRITON_INTERPRET")
    out = tmp_path / "kernels.json"
    assert main(["--dry-run", "--out", str(out)]) == 0
    assert os.environ.get("TRITON_INTERPRET") == before  # the dry run restores the mode
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
