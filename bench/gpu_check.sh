#!/usr/bin/env bash
# One prepared GPU check for the Triton kernels (about 3-5 minutes on an H200; hard cap 8):
#   1. tests/kernels on CUDA: the interpreter tests run compiled, plus the @gpu production shapes
#   2. `kvgate bench kernels --sweep`: kernels vs torch SDPA (flash) at 0.5B and 7B geometries,
#      decode bandwidth, cascade vs per-request decode, and a tile-shape sweep
# Writes under $OUT (default bench/results/gpu/): env.txt, kernel_tests.txt/.xml, kernels.json,
# bench.txt. PYTHON selects the interpreter (default .venv/bin/python, else python3).
set -uo pipefail
cd "$(dirname "$0")/.."
OUT="${OUT:-bench/results/gpu}"
mkdir -p "$OUT"
PY="${PYTHON:-.venv/bin/python}"
[ -x "$PY" ] || PY=python3
export TRITON_DEFAULT_FP_FUSION="${TRITON_DEFAULT_FP_FUSION:-1}"
unset TRITON_INTERPRET

{
  date -u
  nvidia-smi --query-gpu=name,memory.total,clocks.max.sm,driver_version --format=csv || true
  "$PY" -c "import torch, triton; print('torch', torch.__version__, 'triton', triton.__version__,
'cuda', torch.version.cuda, 'device', torch.cuda.get_device_name() if torch.cuda.is_available() else None)"
} > "$OUT/env.txt" 2>&1
cat "$OUT/env.txt"

timeout 240 "$PY" -m pytest tests/kernels -q -p no:cacheprovider -o addopts="" \
  --junitxml="$OUT/kernel_tests.xml" 2>&1 | tee "$OUT/kernel_tests.txt"
tests_rc=${PIPESTATUS[0]}

timeout 220 "$PY" -m bench.kernels --sweep --out "$OUT/kernels.json" 2>&1 | tee "$OUT/bench.txt"
bench_rc=${PIPESTATUS[0]}

echo "kernel tests rc=$tests_rc, bench rc=$bench_rc; results in $OUT"
[ "$tests_rc" -eq 0 ] && [ "$bench_rc" -eq 0 ]
