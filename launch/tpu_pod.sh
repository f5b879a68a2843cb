#!/usr/bin/env bash
# Run a cardjax command on every worker of a TPU pod slice. JAX finds the other workers
# itself (CARDJAX_DISTRIBUTED=auto). The repo must be checked out at the same path on every
# worker (and `pip install -e '.[tpu]'` run there once: `make install` keeps libtpu out of
# the venv, docs/install.md), and --workdir must be a folder every worker sees (a bucket or
# a shared filesystem mount), because all workers write one orbax checkpoint.
#   launch/tpu_pod.sh [--restarts R] TPU_NAME ZONE cardjax train --config configs/card_1b.py --workdir gs://B/runs/card1b
# --restarts R: when the job ends badly on any worker (preempted and saved, stalled, a
# worker lost), it is started again on all workers up to R times and resumes
# (launch/restart.sh). A slice that was deleted or recreated needs the repo set up again.
set -uo pipefail
if [[ ${1:-} == --restarts ]]; then
  restarts=$2; shift 2
  exec "$(dirname "$0")/restart.sh" "$restarts" "$0" "$@"
fi
tpu=$1; zone=$2; shift 2
repo=${CARDJAX_REPO:-$(pwd)}
printf -v cmd '%q ' "$@"
gcloud compute tpus tpu-vm ssh "$tpu" --zone "$zone" --worker=all --command \
  "cd $repo && CARDJAX_DISTRIBUTED=auto CARDJAX_ATTEMPT=${CARDJAX_ATTEMPT:-0} \
PATH=$repo/.venv/bin:\$PATH $cmd"
