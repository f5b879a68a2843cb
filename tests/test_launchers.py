"""The launchers' restart logic (launch/restart.sh, and local.sh, slurm.sbatch, tpu_pod.sh
around it), with small shell commands standing in for the job and fake `srun` and `gcloud`
on PATH: which exit statuses restart, CARDJAX_ATTEMPT, a signal to the launcher, one lost
process stopping the others."""

import os
import signal
import subprocess
import time
from pathlib import Path

import pytest
from launch_helpers import ROOT

LAUNCH = ROOT / "launch"


def _script(path: Path, body: str) -> Path:
  path.write_text("#!/usr/bin/env bash\n" + body)
  path.chmod(0o755)
  return path


def _job(tmp_path, statuses: list[int]) -> Path:
  """A job that exits with statuses[attempt] and logs each attempt to tmp/attempts."""
  codes = " ".join(map(str, statuses))
  return _script(tmp_path / "job.sh", f"""
codes=({codes})
echo "attempt $CARDJAX_ATTEMPT" >> {tmp_path}/attempts
exit ${{codes[$CARDJAX_ATTEMPT]}}
""")


def _attempts(tmp_path) -> list[str]:
  return (tmp_path / "attempts").read_text().split("\n")[:-1]


def _run(cmd, tmp_path, **kw):
  env = {**os.environ, "CARDJAX_RESTART_DELAY": "0", **kw.pop("env", {})}
  return subprocess.run(list(map(str, cmd)), env=env, cwd=kw.pop("cwd", ROOT),
                        capture_output=True, text=True, timeout=60, **kw)


@pytest.mark.parametrize("statuses,restarts,code,runs", [
    ([143, 75, 0], 2, 0, 3),   # preempted, stalled, done
    ([137, 1, 1], 1, 1, 2),    # killed, crashed, no restarts left: the last status
    ([2, 0], 3, 2, 1),         # the user's error: no restart
    ([0], 3, 0, 1),
])
def test_restart_sh_restarts_what_a_rerun_can_fix(tmp_path, statuses, restarts, code, runs):
  result = _run([LAUNCH / "restart.sh", restarts, _job(tmp_path, statuses)], tmp_path)
  assert result.returncode == code, result.stderr
  assert _attempts(tmp_path) == [f"attempt {i}" for i in range(runs)]
  if runs > 1:
    assert f"restart 1 of {restarts}" in result.stderr


def test_restart_sh_rejects_a_bad_count(tmp_path):
  result = _run([LAUNCH / "restart.sh", "x", "true"], tmp_path)
  assert result.returncode == 2 and "whole number" in result.stderr


def test_a_signal_to_the_launcher_reaches_the_job_and_ends_the_series(tmp_path):
  job = _script(tmp_path / "job.sh", f"""
echo "attempt $CARDJAX_ATTEMPT" >> {tmp_path}/attempts
trap 'echo saved >> {tmp_path}/attempts; exit 143' TERM
sleep 30 >/dev/null 2>&1 & wait
""")
  proc = subprocess.Popen([str(LAUNCH / "restart.sh"), "3", str(job)], cwd=ROOT,
                          stderr=subprocess.PIPE, text=True)
  while not (tmp_path / "attempts").exists():
    time.sleep(0.05)
  proc.send_signal(signal.SIGTERM)
  assert proc.wait(timeout=30) == 143
  assert _attempts(tmp_path) == ["attempt 0", "saved"]


def test_local_sh_stops_the_other_processes_when_one_fails_and_restarts(tmp_path):
  job = _script(tmp_path / "host.sh", f"""
echo "attempt $CARDJAX_ATTEMPT process $CARDJAX_PROCESS_ID of $CARDJAX_NUM_PROCESSES" \
  >> {tmp_path}/attempts
if [[ $CARDJAX_ATTEMPT == 0 ]]; then
  if [[ $CARDJAX_PROCESS_ID == 1 ]]; then exit 9; fi   # a host lost
  trap 'echo "process 0 stopped" >> {tmp_path}/attempts; exit 143' TERM
  sleep 30 >/dev/null 2>&1 & wait  # waits for it, as a collective would
fi
""")
  result = _run([LAUNCH / "local.sh", "--restarts", "1", "2", "1", job], tmp_path,
                env={"CARDJAX_STOP_GRACE": "10"})
  assert result.returncode == 0, result.stderr
  lines = _attempts(tmp_path)
  assert sorted(lines[:3]) == sorted(["attempt 0 process 0 of 2", "attempt 0 process 1 of 2",
                                      "process 0 stopped"])
  assert sorted(lines[3:]) == ["attempt 1 process 0 of 2", "attempt 1 process 1 of 2"]
  assert "exit status 9; restart 1 of 1" in result.stderr


def test_local_sh_without_restarts_reports_the_first_bad_status(tmp_path):
  job = _script(tmp_path / "host.sh", """
if [[ $CARDJAX_PROCESS_ID == 0 ]]; then exit 75; fi
exec sleep 30
""")
  start = time.monotonic()
  result = _run([LAUNCH / "local.sh", "2", "1", job], tmp_path, env={"CARDJAX_STOP_GRACE": "2"})
  assert result.returncode == 75
  assert time.monotonic() - start < 20


def _fake_bin(tmp_path, name: str, body: str) -> dict:
  bin_dir = tmp_path / "bin"
  bin_dir.mkdir(exist_ok=True)
  _script(bin_dir / name, body)
  return {"PATH": f"{bin_dir}{os.pathsep}{os.environ['PATH']}"}


def test_slurm_batch_script_restarts_srun_and_passes_the_command(tmp_path):
  env = _fake_bin(tmp_path, "srun", f"""
echo "attempt $CARDJAX_ATTEMPT distributed=$CARDJAX_DISTRIBUTED $*" >> {tmp_path}/attempts
[[ $CARDJAX_ATTEMPT == 1 ]] && exit 0 || exit 143
""")
  result = _run(["bash", LAUNCH / "slurm.sbatch", "--restarts", "2", "cardjax", "train",
                 "--workdir", "w"], tmp_path, env=env)
  assert result.returncode == 0, result.stderr
  assert _attempts(tmp_path) == [
      f"attempt {i} distributed=auto --kill-on-bad-exit=1 .venv/bin/cardjax train --workdir w"
      for i in range(2)]


def test_tpu_pod_script_restarts_gcloud_with_the_attempt_in_the_remote_command(tmp_path):
  env = _fake_bin(tmp_path, "gcloud", f"""
printf '%s\\n' "${{@: -1}}" >> {tmp_path}/attempts
grep -q CARDJAX_ATTEMPT=1 <<< "${{@: -1}}" && exit 0 || exit 255
""")
  result = _run([LAUNCH / "tpu_pod.sh", "--restarts", "1", "my-tpu", "zone-a", "cardjax",
                 "train", "--workdir", "gs://b/run"], tmp_path, env=env)
  assert result.returncode == 0, result.stderr
  commands = _attempts(tmp_path)
  assert len(commands) == 2
  for i, command in enumerate(commands):
    assert f"CARDJAX_DISTRIBUTED=auto CARDJAX_ATTEMPT={i}" in command
    assert command.endswith("cardjax train --workdir gs://b/run ")
