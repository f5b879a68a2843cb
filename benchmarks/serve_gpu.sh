#!/usr/bin/env bash
# The serving load test on an accelerator, as one device call:
#
#   benchmarks/serve_gpu.sh OUT [benchmarks/serve.py flags]
#
# The model is SmolLM2-135M-Instruct's shape with random weights: the real weights (98 MB as
# GGUF, 540 MB in fp32) do not fit the 64 MiB a device call carries, and with ignore_eos
# every request writes exactly its max_tokens, so AR throughput does not depend on the
# weights (MARS's tokens per forward does: its rows would say nothing here). Carry
# runs/smollm2/base/hf_assets (the tokenizer and chat template, 3.4 MB, from `make
# smollm2`) and .whl/ (`make bench-wheels`: the serving stack's wheels for Python 3.12).
# Sets up like attention_gpu.sh (benchmarks/device_setup.sh), writes the random-init
# checkpoint with `cardjax init`, then runs benchmarks/serve.py: AR, continuous batching,
# 1, 4, 16, 64 clients, the defaults against --prefix-page 0 and --admit-wait 0 (the
# issue's target: 16 clients >= 4x one client; `--variants '|--prefix-page 0'` after OUT
# runs fewer servers). The table and results.json go to OUT; the run stops itself
# within ~9 minutes.
set -uo pipefail
cd "$(dirname "$0")/.."
out=${1:?usage: benchmarks/serve_gpu.sh OUT [serve.py flags]}
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
timeout -k 10 500 python3 -m benchmarks.serve --checkpoint "$run" --methods ar \
  --levels 1,4,16,64 --requests 4 --max-tokens 32 --batch-sizes 1,4,16,64 --chunk 16 \
  --warmup-width 64 --slots 256 --warm-levels --variants "|--prefix-page 0|--admit-wait 0" --out "$out" \
  "$@" 2>&1 | tee "$out/serve.log"
exit "${PIPESTATUS[0]}"
