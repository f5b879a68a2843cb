"""launch/local.sh --restarts 2 carries a two-host training job through a preemption and a
lost host without help, and it ends with the weights of a job that met neither. Real
processes over gloo; the faults are made on purpose (CARDJAX_FAULTS)."""

import os
import subprocess

import pytest
from launch_helpers import ROOT, SMALL, cli, two_process_env
from pod_helpers import assert_same_weights, train_args

from cardjax.config import load_config
from cardjax.data.prepare import prepare

pytestmark = pytest.mark.integration  # three attempts and a reference job: minutes


def _launch(args, env, restarts):
  cmd = [str(ROOT / "launch" / "local.sh"), "--restarts", str(restarts), "2", "1",
         *cli("train", *args)]
  return subprocess.run(cmd, env=env, cwd=ROOT, capture_output=True, text=True, timeout=900)


def test_restarts_survive_a_preemption_and_a_killed_host(tmp_path):
  data_dir = tmp_path / "data"
  prepare(load_config("configs/tiny_ar.py", [f"--config.data.data_dir={data_dir}", *SMALL]))
  env = {**two_process_env(dict(os.environ)), "CARDJAX_STOP_GRACE": "30",
         "CARDJAX_RESTART_DELAY": "0"}
  # Attempt 0: host 0 gets SIGTERM before step 20 (every host saves the agreed step).
  # Attempt 1: it resumes there; host 1 dies before step 300 (no save: back to step 200).
  # Attempt 2: it resumes from step 200 and finishes.
  faults = {**env, "CARDJAX_FAULTS": "term@20:0,kill@300:1:1"}
  extra = ("--config.train.checkpoint_every=100",)
  result = _launch(train_args(tmp_path / "run", data_dir, 400, *extra), faults, restarts=2)
  out = result.stdout + result.stderr
  assert result.returncode == 0, out[-6000:]
  assert "exit status 143; restart 1 of 2" in out
  assert "exit status 137; restart 2 of 2" in out  # SIGKILL
  assert "every host saved step" in out
  assert "resuming from step 200 of 400" in out
  straight = _launch(train_args(tmp_path / "straight", data_dir, 400, *extra), env,
                     restarts=0)
  assert straight.returncode == 0, (straight.stdout + straight.stderr)[-4000:]
  assert_same_weights(tmp_path / "run", tmp_path / "straight")
