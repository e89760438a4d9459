# Two commands from a fresh clone: `make demo` (the package alone) and `make test` (with the test, docs and lint tools).
# CPU torch is pinned: an unpinned torch pulls several GB of CUDA packages.
PYTHON ?= python3
VENV ?= .venv
TORCH_VERSION ?= 2.13.0
BIN := $(VENV)/bin
BASE := $(VENV)/.installed-base
STAMP := $(VENV)/.installed

.PHONY: install demo test test-fast lint format docs browser benchmarks gpu-check clean

# The package alone, what `make demo` runs: CPU torch, then the package's own dependencies.
$(BASE): pyproject.toml
	$(PYTHON) -m venv $(VENV)
	$(BIN)/pip install --quiet "torch==$(TORCH_VERSION)"
	$(BIN)/pip install --quiet -e .
	touch $(BASE)

# Then what the tests, the docs site and the linter use: the dev extra (pytest, ruff, MkDocs, dp-accounting), lm
# (transformers, peft) and loggers (MLflow, W&B).
$(STAMP): $(BASE)
	$(BIN)/pip install --quiet -e ".[dev,lm,loggers]"
	touch $(STAMP)

install: $(STAMP)

demo: $(BASE)
	$(BIN)/lightning-privacy demo

test: $(STAMP)
	OMP_NUM_THREADS=1 MKL_NUM_THREADS=1 $(BIN)/python -m pytest -n 2 --dist loadfile

test-fast: $(STAMP)
	OMP_NUM_THREADS=1 MKL_NUM_THREADS=1 $(BIN)/python -m pytest -n 2 --dist loadfile -m "not slow"

# The GPU check (issue 40, benchmarks/gpu_check.py): the CUDA tests, then plain vs DP-SGD steps of GPT-2, into
# benchmarks/results/gpu.md. Without CUDA it is the CPU smoke, into a temporary file. A GPU machine needs no venv here
# (python3 with torch, transformers, peft and Opacus; the script's docstring says what to carry).
GPU_PYTHON ?= $(if $(wildcard $(BIN)/python),$(BIN)/python,python3)
gpu-check:
	$(GPU_PYTHON) benchmarks/gpu_check.py

# Debian's Chromium for the browser tests (TensorBoard page, HTML report); they are skipped where it is missing.
browser:
	@command -v chromium >/dev/null 2>&1 || { command -v apt-get >/dev/null 2>&1 && [ "$$(id -u)" = 0 ] && \
		apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq chromium >/dev/null; } || \
		echo "chromium could not be installed: browser tests will be skipped"

lint: $(STAMP)
	$(BIN)/ruff check .
	$(BIN)/ruff format --check .

# The documentation site (MkDocs Material + mkdocstrings) into site/; --strict fails on any broken link or reference.
docs: $(STAMP)
	NO_MKDOCS_2_WARNING=1 $(BIN)/mkdocs build --strict --quiet

format: $(STAMP)
	$(BIN)/ruff check --fix .
	$(BIN)/ruff format .

clean:
	rm -rf $(VENV) lightning_logs runs site
