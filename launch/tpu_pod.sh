#!/usr/bin/env bash
# Run a cardjax command on every worker of a TPU pod slice. JAX finds the other workers
# itself (CARDJAX_DISTRIBUTED=auto). The repo must be checked out at the same path on every
# worker (and `pip install -e '.[tpu]'` run there once: `make install` keeps libtpu out of
# the venv, docs/install.md), and --workdir must be a folder every worker
# sees (a shared filesystem mount), because all workers write one orbax checkpoint.
#   launch/tpu_pod.sh TPU_NAME ZONE cardjax train --config configs/card_1b.py --workdir /mnt/runs/card1b
set -euo pipefail
tpu=$1; zone=$2; shift 2
repo=${CARDJAX_REPO:-$(pwd)}
printf -v cmd '%q ' "$@"
gcloud compute tpus tpu-vm ssh "$tpu" --zone "$zone" --worker=all --command \
  "cd $repo && CARDJAX_DISTRIBUTED=auto PATH=$repo/.venv/bin:\$PATH $cmd"
