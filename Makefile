# Two entry points for a newcomer: `make demo` and `make test`. Both create the venv on first use.
PY      ?= python3
VENV    := .venv
BIN     := $(VENV)/bin
STAMP   := $(VENV)/.installed
DEMO_SF ?= 0.1
DEMO_DIR ?= data/tpch-sf$(DEMO_SF)

.PHONY: setup bytecode demo test test-fast lint bench clean lock

setup: $(STAMP)

# Exact, hashed versions from requirements.lock (regenerate with `make lock`), then duckflock itself
# (with its one C module, the exchange's row scatter: a C compiler is needed) and the benchmarks
# project (benchmarks/, its own package: the core install holds no benchmark code).
$(STAMP): pyproject.toml setup.py src/duckflock/exchange/_scatter.c benchmarks/pyproject.toml requirements.lock
	$(PY) -m venv $(VENV)
	$(BIN)/pip install --quiet --upgrade pip
	$(BIN)/pip install --quiet --require-hashes -r requirements.lock
	$(BIN)/pip install --quiet --no-deps -e . -e benchmarks
	touch $(STAMP)

lock:
	$(PY) -m venv .lock-venv && .lock-venv/bin/pip install --quiet uv
	.lock-venv/bin/uv pip compile requirements.in \
		--generate-hashes --universal --python-version 3.11 --no-header \
		--no-emit-package duckflock --no-emit-package duckflock-bench \
		-o requirements.lock
	rm -rf .lock-venv

# Every rank of a job imports duckflock. Where PYTHONDONTWRITEBYTECODE is set, Python never caches
# the compiled modules, and each rank compiled them from source again: 0.14 s of CPU per rank, 0.2 s
# of a 4-rank job's start on 2 cores. Compiled here once (only what changed since).
bytecode: $(STAMP)
	$(BIN)/python -m compileall -q src benchmarks/duckflock_bench

demo: bytecode
	$(BIN)/duckflock demo --sf $(DEMO_SF) --data $(DEMO_DIR) --ranks 4

test: bytecode
	$(BIN)/ruff check src tests benchmarks
	$(BIN)/ruff format --check src tests benchmarks
	$(BIN)/mypy
	$(BIN)/pytest -q

# The edit loop (a few minutes): unit tests and each .test file once, on 2 ranks as threads;
# `make test` runs everything, as CI does.
test-fast: bytecode
	$(BIN)/ruff check src tests benchmarks
	$(BIN)/pytest -q -m "not slow and not dist" tests/unit tests/sql

lint: $(STAMP)
	$(BIN)/ruff check src tests benchmarks
	$(BIN)/ruff format --check src tests benchmarks
	$(BIN)/mypy

bench: bytecode
	$(BIN)/duckflock bench seed --sf 0.1,0.5,1 --ranks 1,2,4

clean:
	rm -rf $(VENV) data bench-results
