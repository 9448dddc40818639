#!/usr/bin/env bash
# One prepared GPU check (about 4-6 minutes on an H200; hard cap under 8):
#   1. tests/kernels on CUDA: the interpreter tests run compiled, plus the @gpu production shapes
#   2. `python -m bench.kernels`: kernels vs torch SDPA (flash) at 0.5B and 7B geometries, decode
#      bandwidth, cascade vs per-request decode (SWEEP=1 adds the tile-shape sweep; allow more time)
#   3. `python -m bench.gpu_engine`: the engine end to end on a random Qwen2.5-0.5B-geometry model:
#      bf16 logits vs HF transformers bf16 (max abs diff, top-1 agreement), load / warm-up / graph
#      capture seconds and Triton compilations after start-up, decode tokens/s at batch 1/8/64
#      with CUDA graphs on and off, prefill tokens/s vs HF SDPA, the cold-cache burst
# Writes under $OUT (default bench/results/gpu/): env.txt, kernel_tests.txt/.xml, kernels.json,
# bench.txt, engine.json, engine.txt. PYTHON selects the interpreter (default .venv/bin/python,
# else python3). `--dry-run`: CPU only, no tests, both benchmarks in their dry-run mode (checks
# this script end to end; tests/kernels/test_bench_kernels.py runs it).
set -uo pipefail
cd "$(dirname "$0")/.."
OUT="${OUT:-bench/results/gpu}"
mkdir -p "$OUT"
PY="${PYTHON:-.venv/bin/python}"
[ -x "$PY" ] || PY=python3
DRY=""
[ "${1:-}" = "--dry-run" ] && DRY="--dry-run"
export TRITON_DEFAULT_FP_FUSION="${TRITON_DEFAULT_FP_FUSION:-1}"
unset TRITON_INTERPRET

{
  date -u
  nvidia-smi --query-gpu=name,memory.total,clocks.max.sm,driver_version --format=csv || true
  "$PY" -c "import torch, triton; print('torch', torch.__version__, 'triton', triton.__version__,
'cuda', torch.version.cuda, 'device', torch.cuda.get_device_name() if torch.cuda.is_available() else None)"
} > "$OUT/env.txt" 2>&1
cat "$OUT/env.txt"

tests_rc=0
if [ -z "$DRY" ]; then
  # CPU-only checks (sm_90 compile with the wheel's ptxas, this script's dry run) are CI's
  timeout 150 "$PY" -m pytest tests/kernels -q -p no:cacheprovider -o addopts="" \
    --deselect tests/kernels/test_compile_sm90.py \
    --deselect tests/kernels/test_bench_kernels.py::test_gpu_check_script_dry_run_writes_both_results \
    --junitxml="$OUT/kernel_tests.xml" 2>&1 | tee "$OUT/kernel_tests.txt"
  tests_rc=${PIPESTATUS[0]}
fi

if [ -z "$DRY" ]; then
  timeout 120 "$PY" -m bench.kernels ${SWEEP:+--sweep} --out "$OUT/kernels.json" 2>&1 \
    | tee "$OUT/bench.txt"
else
  TRITON_INTERPRET=1 timeout 130 "$PY" -m bench.kernels --dry-run --out "$OUT/kernels.json" \
    2>&1 | tee "$OUT/bench.txt"
fi
bench_rc=${PIPESTATUS[0]}

timeout 180 "$PY" -m bench.gpu_engine $DRY --out "$OUT/engine.json" 2>&1 | tee "$OUT/engine.txt"
engine_rc=${PIPESTATUS[0]}

echo "kernel tests rc=$tests_rc, kernel bench rc=$bench_rc, engine bench rc=$engine_rc; results in $OUT"
[ "$tests_rc" -eq 0 ] && [ "$bench_rc" -eq 0 ] && [ "$engine_rc" -eq 0 ]
