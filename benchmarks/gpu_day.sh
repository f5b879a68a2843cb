#!/usr/bin/env bash
# The prepared accelerator call: the figures users ask for first, in one call of at most
# 9 minutes on one H100 or H200 from a cold machine, with no network:
#
#   benchmarks/gpu_day.sh OUT               # on the GPU machine (carry .whl and the pack)
#   benchmarks/gpu_day.sh OUT --cpu-smoke   # here: every section at toy sizes, ~2 minutes
#
# Sections, in order, each its own process with its own time slot (a hang or a crash in one
# leaves the others their time), each writing OUT/SECTION.json after every row and its
# table to OUT/gpu_day.md as rows come (docs/development.md, "The prepared GPU call"):
#   1. decode        AR vs MARS (tau 1/0.95/0.9; fit and 2B window, block cache), verified
#                    MARS, then CARD blocks and DUS, at batch 1, 4, 16, from the bench pack
#                    (benchmarks/decode_device.py; no training on the GPU)
#   2. forward_cost  ms per cached forward by new tokens per row and batch, SmolLM2-135M and
#                    Qwen2.5-0.5B shapes, bf16 (benchmarks/forward_cost.py)
#   3. train_step    the trainer's step for the MARS-0.5B and card_1b shapes: tokens/s and
#                    MFU with each attention implementation (benchmarks/train_mfu.py)
#   4. attention     the Pallas GPU kernels (Triton, and the Hopper kernels on sm_90)
#                    against cuDNN (benchmarks/attention_day.py)
# OUT ends with at most 8 files, no folders: the four JSONs, gpu_day.md, gpu_day.log (all
# output) and machine.txt. A section cut off by its slot is marked "timed_out" in its JSON
# and keeps its rows; one never reached is "skipped".
#
# What the call carries (make gpu-day-carry): .whl/ (the wheels the GPU image lacks, ~23 MB)
# and, when present, runs/bench_pack (make bench-pack-day: the seed-0 decode runs with the
# code models, ~14 MB); without it the section decodes results/bench_pack (committed: the
# arith SFT and MARS runs, ~7 MB) and says it has no code rows.
set -uo pipefail
cd "$(dirname "$0")/.."
out=${1:?usage: benchmarks/gpu_day.sh OUT [--cpu-smoke]}
smoke=0
[ "${2:-}" = "--cpu-smoke" ] && smoke=1
mkdir -p "$out"
out=$(cd "$out" && pwd)
: > "$out/gpu_day.log"
exec > >(tee -a "$out/gpu_day.log") 2>&1
PY=${PYTHON:-python3}
start=$SECONDS
deadline=${CARDJAX_DAY_SECONDS:-530}  # the whole call, setup included

if [ "$smoke" = 1 ]; then
  # The smoke run uses the environment it runs in (CARDJAX_SKIP_WHEELS= installs .whl/ too:
  # a check of the wheels against an image like the GPU machine's).
  export JAX_PLATFORMS=cpu CARDJAX_SKIP_WHEELS=${CARDJAX_SKIP_WHEELS-1}
  flag=--smoke
  deadline=${CARDJAX_DAY_SECONDS:-600}
else
  flag=
  # Compiled programs stay on the machine (a rerun on it starts warm), never in OUT.
  export JAX_COMPILATION_CACHE_DIR=${JAX_COMPILATION_CACHE_DIR:-/tmp/cardjax-day-xla}
fi
echo "# cardjax prepared GPU call, $(date -u '+%Y-%m-%d %H:%M UTC')$([ $smoke = 1 ] && echo ', CPU smoke run')" \
  > "$out/gpu_day.md"
source benchmarks/device_setup.sh
echo "machine: $(tr '\n' ' ' < "$out/machine.txt")" >> "$out/gpu_day.md"

# run_section NAME SLOT MARGIN MODULE [ARGS]: MODULE gets --json, --md and --budget-s (the
# slot less MARGIN: the time a last row may take), under a hard timeout of the slot or
# what is left of the deadline, whichever is less.
status=0
run_section() {
  local name=$1 slot=$2 margin=$3 module=$4
  shift 4
  local left=$(( deadline - (SECONDS - start) ))
  local limit=$(( slot < left ? slot : left ))
  if [ "$limit" -lt 30 ]; then
    echo "== $name: skipped, ${left} s left of the call" | tee -a "$out/gpu_day.md"
    "$PY" -m benchmarks.sections --mark "$out/$name.json" skipped
    return
  fi
  local budget=$(( limit - margin > 10 ? limit - margin : 10 ))
  echo "== $name: up to $limit s (new rows until $budget s)"
  timeout -k 10 "$limit" "$PY" -m "$module" --json "$out/$name.json" --md "$out/gpu_day.md" \
    --budget-s "$budget" $flag "$@"
  local rc=$?
  if [ "$rc" = 124 ] || [ "$rc" = 137 ]; then
    echo "== $name: stopped by its $limit s limit; the rows above were measured" \
      | tee -a "$out/gpu_day.md"
    "$PY" -m benchmarks.sections --mark "$out/$name.json" timed_out
  elif [ "$rc" != 0 ]; then
    echo "== $name: exit status $rc (see gpu_day.log)" | tee -a "$out/gpu_day.md"
    "$PY" -m benchmarks.sections --mark "$out/$name.json" failed
  fi
  [ "$rc" != 0 ] && status=$rc
  echo "== $name done at $(( SECONDS - start )) s"
}

pack=${CARDJAX_PACK:-}
if [ "$smoke" = 1 ]; then
  pack=$(mktemp -d /tmp/cardjax-smoke-pack.XXXXXX)
  "$PY" -m benchmarks.smoke_pack "$pack" > /dev/null 2>&1 || { echo "smoke pack failed"; exit 1; }
elif [ -z "$pack" ]; then
  pack=results/bench_pack
  [ -f runs/bench_pack/inputs.json ] && pack=runs/bench_pack
fi

run_section decode 190 45 benchmarks.decode_device --pack "$pack"
run_section forward_cost 90 25 benchmarks.forward_cost
XLA_PYTHON_CLIENT_MEM_FRACTION=0.92 run_section train_step 150 55 benchmarks.train_mfu
run_section attention 75 30 benchmarks.attention_day
[ "$smoke" = 1 ] && rm -rf "$pack"
echo "== gpu_day: $(( SECONDS - start )) s; files in $out: $(ls "$out" | tr '\n' ' ')"
exit "$status"
