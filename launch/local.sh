#!/usr/bin/env bash
# Run any cardjax command as N local processes (a multi-host job on one machine, e.g. to
# test multi-host code on CPU: each process gets DEVICES simulated CPU devices, collectives
# over gloo). Usage:
#   launch/local.sh [--restarts R] N DEVICES cardjax train --config configs/tiny_ar.py --workdir runs/x
# When one process ends badly the others get SIGTERM, and SIGKILL after CARDJAX_STOP_GRACE
# seconds (default 120); the job's status is the first bad one. --restarts R starts the job
# again up to R times (launch/restart.sh): a preempted, stalled or crashed job resumes.
set -uo pipefail
if [[ ${1:-} == --restarts ]]; then
  restarts=$2; shift 2
  exec "$(dirname "$0")/restart.sh" "$restarts" "$0" "$@"
fi
n=$1; devices=$2; shift 2
port=${CARDJAX_PORT:-$((20000 + RANDOM % 20000))}
grace=${CARDJAX_STOP_GRACE:-120}
pids=()
for ((i = 0; i < n; i++)); do
  CARDJAX_COORDINATOR=127.0.0.1:$port CARDJAX_NUM_PROCESSES=$n CARDJAX_PROCESS_ID=$i \
  JAX_PLATFORMS=${JAX_PLATFORMS:-cpu} \
  XLA_FLAGS="--xla_force_host_platform_device_count=$devices ${XLA_FLAGS:-}" \
    "$@" &
  pids+=($!)
done
stop_all() {  # SIGTERM to the processes still running; SIGKILL to those left after grace
  kill -TERM "${pids[@]}" 2>/dev/null
  for ((t = 0; t < grace * 10; t++)); do
    alive=0
    for pid in "${pids[@]}"; do kill -0 "$pid" 2>/dev/null && alive=1; done
    ((alive)) || return 0
    sleep 0.1
  done
  kill -KILL "${pids[@]}" 2>/dev/null
}
trap stop_all TERM INT  # a preemption of this machine reaches every process
status=0; done_pids=()
while ((${#done_pids[@]} < n)); do
  for pid in "${pids[@]}"; do
    [[ " ${done_pids[*]} " == *" $pid "* ]] && continue
    kill -0 "$pid" 2>/dev/null && continue
    wait "$pid"; code=$?
    done_pids+=("$pid")
    if ((code != 0 && status == 0)); then
      status=$code
      stop_all &  # the others would wait for the lost process in their next collective
    fi
  done
  sleep 0.2
done
wait
exit $status
