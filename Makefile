# The two commands of the README: `make serve` and `make test`.
# Each creates .venv when missing and installs what it needs: the gateway with the engine extra
# (torch pinned: the CPU build on disk; every other package at the version in constraints.txt,
# the set CI tests) and the dev tools.
PY      ?= python3
VENV    := .venv
BIN     := $(VENV)/bin
STAMP   := $(VENV)/.installed-dev
TORCH   := torch==2.13.0

.PHONY: serve test lint install clean

$(BIN)/python:
	$(PY) -m venv $(VENV)
	$(BIN)/pip install --quiet --upgrade pip

$(STAMP): pyproject.toml constraints.txt | $(BIN)/python
	$(BIN)/pip install --quiet $(TORCH)
	$(BIN)/pip install --quiet -c constraints.txt -e '.[engine,dev]' $(TORCH)
	touch $(STAMP)

install: $(STAMP)

serve: $(STAMP)
	$(BIN)/kvgate serve $(ARGS)

# A second pass holds every CPU kernel to AVX2 (kvgate's GEMM, torch and oneDNN:
# engine/runtime/cpu_isa.py), so an AVX-512 host also tests what an AVX2-only one computes: the CPU GEMM
# tests, model parity with transformers (tests/engine/model), logprobs, determinism and
# the async engine. The real default model's parity test (tests/e2e) stays in the first pass only:
# it takes minutes, and tests/engine/model checks the same decoder and GGUF dequantization.
# bf16: on a CPU with bf16 units (AMX-BF16, AVX512_BF16) the first pass tests oneDNN's bf16
# linears and the bf16 model (test_cpu_bf16.py, tests/engine/model/test_bf16.py); this pass,
# where avx2 turns the units off, tests the bf16 reference (F.linear) those hosts fall back to.
CPU_ISA_TESTS := tests/kernels/test_cpu_gemm.py tests/kernels/test_cpu_qgemm.py \
	tests/kernels/test_cpu_bf16.py \
	tests/kernels/test_cpu_ops.py tests/kernels/test_cpu_layers.py tests/engine/model \
	tests/engine/test_sampling_engine.py tests/engine/test_determinism.py \
	tests/engine/test_async_engine.py

# mypy (config: pyproject.toml [tool.mypy]) checks engine/, gateway/ and tenants/ right after ruff,
# strict (every def annotated, no Any returned for a declared type, no bare generics, no implicit
# re-export, strict equality, error-coded ignores only); its incremental cache is .mypy_cache
# (a warm run takes seconds). docs/structure.md, "Type checking".
test: $(STAMP)
	$(BIN)/ruff check .
	$(BIN)/mypy
	$(BIN)/python -m pytest -q -p no:cacheprovider $(PYTEST_ARGS)
	KVGATE_CPU_ISA=avx2 $(BIN)/python -m pytest -q -p no:cacheprovider $(CPU_ISA_TESTS)

lint: $(STAMP)
	$(BIN)/ruff check .
	$(BIN)/ruff format --check .
	$(BIN)/mypy

clean:
	rm -rf $(VENV) var .pytest_cache .ruff_cache .mypy_cache
