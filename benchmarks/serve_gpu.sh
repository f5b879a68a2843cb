#!/usr/bin/env bash
# The serving load test on an accelerator, as one device call:
#
#   benchmarks/serve_gpu.sh OUT [benchmarks/serve_overhead.py flags]
#
# The model is SmolLM2-135M-Instruct's shape with random weights: the real weights (98 MB as
# GGUF, 540 MB in fp32) do not fit the 64 MiB a device call carries, and with ignore_eos
# every request writes exactly its max_tokens, so AR throughput does not depend on the
# weights (MARS's tokens per forward does: its rows would say nothing here). Carry
# runs/smollm2/base/hf_assets (the tokenizer and chat template, 3.4 MB, from `make
# smollm2`) and .whl/ (`make bench-wheels`: the serving stack's wheels for Python 3.12).
# Sets up like attention_gpu.sh (benchmarks/device_setup.sh) and writes the random-init
# checkpoint with `cardjax init`. Then, within ~9.5 minutes in all (the
# timeouts below add up to 545 s, under a device call's 600):
#   1. benchmarks/serve_overhead.py (AR; 1, 4, 16, 64 clients; 32 tokens a request): the
#      server against a bare loop of its own compiled step, first and cached warm-up,
#      first-burst rates and compilations after the warm-up -> OUT/overhead.json
#   2. the same at 1 and 64 clients with --no-overlap, its programs from the first run's
#      compilation cache -> OUT/overhead_no_overlap.json; then at 16 and 64 clients with
#      refill steps of 4 forwards -> OUT/overhead_refill.json
#   3. while time remains, benchmarks/serve.py's load test (the defaults and
#      --prefix-page 0) -> OUT/results.json
# The targets: at least 3x 4508 tokens/s at 64 clients (the first H200 run) and at most
# 0.7 ms a token at 1 client. Flags after OUT go to serve_overhead.py.
set -uo pipefail
cd "$(dirname "$0")/.."
out=${1:?usage: benchmarks/serve_gpu.sh OUT [serve_overhead.py flags]}
shift
mkdir -p "$out"
# Compiled programs stay on the device machine, not in OUT (which comes back).
export JAX_COMPILATION_CACHE_DIR=${JAX_COMPILATION_CACHE_DIR:-/tmp/cardjax-serve-xla}
source benchmarks/device_setup.sh
tokenizer=${CARDJAX_TOKENIZER:-runs/smollm2/base/hf_assets}
[ -f "$tokenizer/tokenizer.json" ] || { echo "no $tokenizer/tokenizer.json: carry it" >&2; exit 2; }
run=${CARDJAX_SERVE_RUN:-/tmp/cardjax-serve-init}
[ -d "$run/checkpoints" ] || python3 -m cardjax.cli init --config configs/smollm2_135m.py:mars \
  --workdir "$run" --config.data.tokenizer="$tokenizer" || exit 1
log=$out/serve.log
# Prompts of 24 tokens: a warm-up to width 64 covers them (the default, every width up to
# the slots, would spend the call compiling prefills no request here reaches).
timeout -k 10 270 python3 -m benchmarks.serve_overhead --checkpoint "$run" --methods ar \
  --levels 1,4,16,64 --repeats 2 --out /tmp/cardjax-serve-overhead \
  --server-flags="--warmup-width 64" --json "$out/overhead.json" "$@" 2>&1 | tee "$log"
status=${PIPESTATUS[0]}
timeout -k 10 100 python3 -m benchmarks.serve_overhead --checkpoint "$run" --methods ar \
  --levels 1,64 --repeats 1 --out /tmp/cardjax-serve-overhead \
  --keep-cache --server-flags="--warmup-width 64 --no-overlap" \
  --json "$out/overhead_no_overlap.json" \
  "$@" 2>&1 | tee -a "$log"
timeout -k 10 75 python3 -m benchmarks.serve_overhead --checkpoint "$run" --methods ar \
  --levels 16,64 --repeats 1 --out /tmp/cardjax-serve-overhead \
  --keep-cache --server-flags="--warmup-width 64 --refill-step 4" \
  --json "$out/overhead_refill.json" \
  "$@" 2>&1 | tee -a "$log"
timeout -k 10 100 python3 -m benchmarks.serve --checkpoint "$run" --methods ar \
  --levels 1,16,64 --requests 4 --max-tokens 32 --batch-sizes 1,4,16,64 --chunk 16 \
  --warmup-width 64 --slots 256 --warm-levels --variants "|--prefix-page 0" --out "$out" \
  2>&1 | tee -a "$log"
exit "$status"
