#!/usr/bin/env bash
# Run a job command and start it again when it ends badly, up to R more times:
#   launch/restart.sh R cmd...
# Exit status 0 (done) and 2 (an error the user must fix: a restart would fail the same way)
# end it at once; any other status (143 preempted and saved, 75 stalled, a crash, a host
# killed) starts the command again, which resumes from the newest checkpoint. Each run sees
# CARDJAX_ATTEMPT (0, 1, ...). A SIGTERM or SIGINT to this script is passed to the running
# command and ends the series: a preempted launcher does not start the job again.
# The exit codes: cardjax/train/exit_codes.py; docs/pods.md.
set -uo pipefail
restarts=$1; shift
if ! [[ $restarts =~ ^[0-9]+$ ]]; then
  echo "launch/restart.sh: restarts must be a whole number, got '$restarts'" >&2; exit 2
fi
child=""; stopping=0
on_signal() {
  stopping=1
  if [[ -n $child ]]; then kill -TERM "$child" 2>/dev/null; fi
}
trap on_signal TERM INT
for ((attempt = 0; ; attempt++)); do
  CARDJAX_ATTEMPT=$attempt "$@" &
  child=$!
  # wait returns early when a trapped signal arrives: wait again for the command's status.
  while true; do
    wait "$child"; status=$?
    kill -0 "$child" 2>/dev/null || break
  done
  child=""
  if ((status == 0 || status == 2 || stopping)); then exit "$status"; fi
  if ((attempt >= restarts)); then
    echo "launch/restart.sh: exit status $status after $((attempt + 1)) attempts;" \
         "no restarts left" >&2
    exit "$status"
  fi
  echo "launch/restart.sh: exit status $status; restart $((attempt + 1)) of $restarts" >&2
  sleep "${CARDJAX_RESTART_DELAY:-1}"
done
