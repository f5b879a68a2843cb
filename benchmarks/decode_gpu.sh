#!/usr/bin/env bash
# The decode benchmark's arith table (AR with a KV cache vs MARS over tau, and self-verified
# MARS) on an accelerator as one device call, training its two models there first:
#
#   benchmarks/decode_gpu.sh OUT [benchmarks/decode.py flags]
#
# For a box that has no trained bench pack (decode_offline.sh needs `make bench-pack`, about
# 85 minutes a seed on 2 CPU cores): the SFT and MARS models of configs/decode_bench.py are
# trained on the accelerator itself (seed 0, arith_sft built there; no network needed),
# packed into OUT/bench_pack (a few MB: carry it to decode them again elsewhere), then
# decoded with fewer timing repeats than the CPU default so that the call ends within
# ~9.5 minutes. Carry .whl/ (`make bench-wheels`). The tables, results.json and the rows
# measured so far go to OUT even when a step runs out of time.
set -uo pipefail
cd "$(dirname "$0")/.."
out=${1:?usage: benchmarks/decode_gpu.sh OUT [decode.py flags]}
shift
mkdir -p "$out"
export JAX_COMPILATION_CACHE_DIR=${JAX_COMPILATION_CACHE_DIR:-/tmp/cardjax-decode-xla}
source benchmarks/device_setup.sh
work=${CARDJAX_BENCH_WORKDIR:-/tmp/cardjax-bench-gpu}
start=$SECONDS
timeout -k 10 ${CARDJAX_TRAIN_SECONDS:-300} python3 -m benchmarks.decode --workdir "$work" \
  --tasks arith --seeds 0 --train-only 2>&1 | tail -n 40 | tee "$out/train.log"
python3 -m benchmarks.pack_runs "$work" "$out/bench_pack" > /dev/null 2>&1 || true
left=$(( ${CARDJAX_CALL_SECONDS:-560} - (SECONDS - start) ))
echo "training took $((SECONDS - start)) s; decoding for at most $left s" | tee -a "$out/train.log"
timeout -k 10 "$left" python3 -m benchmarks.decode --workdir "$work" --tasks arith --seeds 0 \
  --repeats 3 --min-seconds 0.5 "$@" 2>&1 | tee "$out/decode.log"
status=${PIPESTATUS[0]}
for f in decode.md results.json decode_rows.md decode.png; do
  [ -f "$work/$f" ] && cp "$work/$f" "$out/"
done
exit "$status"
