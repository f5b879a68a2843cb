#!/usr/bin/env bash
# Fine-tune SmolLM2-135M-Instruct for one training seed: AR SFT, then MARS from it
# (configs/smollm2_135m.py), into ROOT/seedS/{sft,mars} with ROOT/seedS/base -> the import.
# The seed sets data order and corruption keys (both stages start from checkpoints).
# Re-running resumes each stage from its latest checkpoint. Needs `make smollm2` first and
# CARDJAX_DATA_DIR where arith_sft was built (cardjax train builds it otherwise).
#   benchmarks/real_model_train.sh SEED [ROOT=runs/smollm2]
set -euo pipefail
seed=${1:?usage: benchmarks/real_model_train.sh SEED [ROOT]}
root=${2:-runs/smollm2}
dir="$root/seed$seed"
[ -d "$root/base" ] || { echo "no $root/base: run 'make smollm2' first" >&2; exit 1; }
mkdir -p "$dir"
ln -sfn ../base "$dir/base"
cardjax train --config configs/smollm2_135m.py:sft --workdir "$dir/sft" \
  --config.seed="$seed" --config.train.init_from="$root/base"
cardjax train --config configs/smollm2_135m.py:mars --workdir "$dir/mars" \
  --config.seed="$seed" --config.train.init_from="$dir/sft/checkpoints"
