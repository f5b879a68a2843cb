"""A host that hangs mid-run: every host's watchdog finds the stall, dumps its threads'
stacks to its log and exits 75, the status the launchers restart on. Real processes over
gloo; the hang is made on purpose (CARDJAX_FAULTS)."""

import os
import time

import pytest
from launch_helpers import SMALL
from pod_helpers import Hosts, train_args, wait_for_step

from cardjax.config import load_config
from cardjax.data.prepare import prepare
from cardjax.train import exit_codes

pytestmark = pytest.mark.integration  # a two-host job and a 15 s stall limit


def test_a_hung_host_stops_the_job_with_stacks_and_the_stall_code(tmp_path):
  data_dir = tmp_path / "data"
  prepare(load_config("configs/tiny_ar.py", [f"--config.data.data_dir={data_dir}", *SMALL]))
  env = {**os.environ, "CARDJAX_FAULTS": "hang@8:1"}
  args = train_args(tmp_path / "run", data_dir, 100_000, "--config.train.log_every=1",
                    "--config.train.stall_timeout=15")
  hosts = Hosts(2, args, tmp_path / "logs", env=env)
  wait_for_step(tmp_path / "run", 5, hosts)
  start = time.monotonic()
  assert hosts.wait(timeout=120) == [exit_codes.STALLED] * 2, hosts.tail()
  assert time.monotonic() - start < 60
  for i in range(2):
    out = hosts.output(i)
    assert "stalled: no training step finished for" in out and "Current thread" in out, out
  # The hung host's stacks show where it stopped.
  assert 'faults.py", line' in hosts.output(1)
