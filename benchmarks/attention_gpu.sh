#!/usr/bin/env bash
# The block-sparse Pallas GPU attention kernel against cuDNN, as one device call:
#
#   benchmarks/attention_gpu.sh OUT [benchmarks/attention.py flags]
#
# Needs only jax with a CUDA backend (jax[cuda12] 0.10 or 0.11, whose Pallas ships the
# Triton lowering) and numpy: no network, no datasets, no models. Installs .whl/ (if any,
# benchmarks/device_setup.sh) into a private folder, prints the devices, then runs
# benchmarks/attention.py --kernel: tile tables, the kernel's device tables, a compiled
# max-error check against the dense reference (timings are skipped if it fails) and the
# timing table (kernel vs cuDNN + dense mask vs cuDNN causal; causal, packed and MARS
# dual-stream rows, L = 1024 .. 16384, forward and forward+backward), then
# benchmarks/attention_decode.py (the flash-decoding kernel against xla's cache_attention:
# AR step, MARS window, prefill over 1K-16K slots). Every line goes to
# OUT/attention_gpu.md and OUT/attention_decode.md as it is measured, so a run cut short by
# a time limit keeps its rows; the whole run stops itself within ~9.5 minutes (timing rows
# stop at 300 s, the decode table has 150 s).
set -uo pipefail
cd "$(dirname "$0")/.."
out=${1:?usage: benchmarks/attention_gpu.sh OUT [attention.py flags]}
shift
mkdir -p "$out"
# Let XLA take memory as it needs it: the dense masks of the cuDNN baseline are large.
export XLA_PYTHON_CLIENT_PREALLOCATE=false
source benchmarks/device_setup.sh
timeout -k 10 400 python3 -m benchmarks.attention --kernel --budget-s 300 \
  --out "$out/attention_gpu.md" "$@" 2>&1 | tee "$out/attention_gpu.log"
status=${PIPESTATUS[0]}
[ "$status" = 124 ] && echo "stopped by the 400 s limit; the rows above were measured" \
  | tee -a "$out/attention_gpu.md"
# The flash-decoding kernel against xla's cache_attention (decoding's cached forwards).
timeout -k 10 150 python3 -m benchmarks.attention_decode --out "$out/attention_decode.md" \
  2>&1 | tee "$out/attention_decode.log"
decode_status=${PIPESTATUS[0]}
[ "$decode_status" = 124 ] && echo "stopped by the 150 s limit; the rows above were measured" \
  | tee -a "$out/attention_decode.md"
[ "$status" = 0 ] && status=$decode_status
exit "$status"
