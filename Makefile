# Set-up is two commands on a fresh machine: `make demo` and `make test`.
# Both create .venv when it is missing and install cardjax into it.
PY ?= python3.11
VENV := .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.installed
PYTEST_ARGS ?=

.PHONY: demo test test-slow bench-decode install clean

$(BIN)/python:
	$(PY) -m venv $(VENV)
	$(BIN)/python -m pip install -q --upgrade pip

$(STAMP): pyproject.toml | $(BIN)/python
	# torch first, pinned, so that no dependency can pull a CUDA build.
	$(BIN)/python -m pip install -q torch==2.13.0
	$(BIN)/python -m pip install -q -e '.[test]'
	touch $(STAMP)

install: $(STAMP)

demo: $(STAMP)
	$(BIN)/cardjax demo --workdir runs/demo

test: $(STAMP)
	$(BIN)/python -m pytest -q -m "not slow" $(PYTEST_ARGS)

test-slow: $(STAMP)
	$(BIN)/python -m pytest -q -m slow $(PYTEST_ARGS)

# The decoding benchmark: trains configs/decode_bench.py's models (about 40 min on 2 CPU
# cores), then prints the speed-quality table and writes runs/bench_decode/decode.png.
bench-decode: $(STAMP)
	$(BIN)/python -m pip install -q -e '.[test,bench]'
	$(BIN)/python benchmarks/decode.py --workdir runs/bench_decode

clean:
	rm -rf $(VENV) runs build *.egg-info
