#!/usr/bin/env bash
# The decode benchmark on a machine with an accelerator and no network, from a pack made
# on the machine that trained the models:
#
#   make bench-pack          # there: runs/bench_pack (models, tokenizers, prompt ids) and
#                            # .whl/ (wheels of the packages such a box usually lacks)
#   # copy the repo with runs/bench_pack and .whl/ to the box, then on it:
#   benchmarks/decode_offline.sh OUT [benchmarks/decode.py flags]
#
# Installs .whl/ (if any) into a private folder, prints the devices, runs
# benchmarks/decode.py --no-train on the pack and copies its tables to OUT, also when the
# run stops early (decode_rows.md holds every row measured until then).
set -uo pipefail
cd "$(dirname "$0")/.."
out=${1:?usage: benchmarks/decode_offline.sh OUT [decode.py flags]}
shift
mkdir -p "$out"
export PYTHONPATH="$PWD"
if compgen -G ".whl/*.whl" > /dev/null; then
  python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade \
    --target /tmp/cardjax-site .whl/*.whl || exit 1
  export PYTHONPATH="/tmp/cardjax-site:$PWD"
fi
export PYTHONUNBUFFERED=1
python3 -c "import jax, flax; print('jax', jax.__version__, 'flax', flax.__version__, jax.devices())"
python3 -m benchmarks.decode --workdir runs/bench_pack --no-train "$@" 2>&1 | tee "$out/decode.log"
status=${PIPESTATUS[0]}
for f in decode.md results.json decode_rows.md decode.png; do
  [ -f "runs/bench_pack/$f" ] && cp "runs/bench_pack/$f" "$out/"
done
exit "$status"
