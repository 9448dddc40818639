# The two commands of the README: `make serve` and `make test`.
# Each creates .venv when missing and installs what it needs (torch pinned: the CPU build on disk;
# every other package at the version in constraints.txt, the set CI tests).
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
	$(BIN)/pip install --quiet -c constraints.txt -e '.[dev]' $(TORCH)
	touch $(STAMP)

install: $(STAMP)

serve: $(STAMP)
	$(BIN)/kvgate serve $(ARGS)

test: $(STAMP)
	$(BIN)/ruff check .
	$(BIN)/python -m pytest -q -p no:cacheprovider $(PYTEST_ARGS)

lint: $(STAMP)
	$(BIN)/ruff check .
	$(BIN)/ruff format --check .

clean:
	rm -rf $(VENV) var .pytest_cache .ruff_cache
