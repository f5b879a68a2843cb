#!/usr/bin/env bash
# Run any cardjax command as N local processes (a multi-host job on one machine, e.g. to
# test multi-host code on CPU: each process gets DEVICES simulated CPU devices, collectives
# over gloo). Usage:
#   launch/local.sh N DEVICES cardjax train --config configs/tiny_ar.py --workdir runs/x
set -euo pipefail
n=$1; devices=$2; shift 2
port=${CARDJAX_PORT:-$((20000 + RANDOM % 20000))}
pids=()
for ((i = 0; i < n; i++)); do
  CARDJAX_COORDINATOR=127.0.0.1:$port CARDJAX_NUM_PROCESSES=$n CARDJAX_PROCESS_ID=$i \
  JAX_PLATFORMS=${JAX_PLATFORMS:-cpu} \
  XLA_FLAGS="--xla_force_host_platform_device_count=$devices ${XLA_FLAGS:-}" \
    "$@" &
  pids+=($!)
done
status=0
for pid in "${pids[@]}"; do wait "$pid" || status=$?; done
exit $status
