"""SIGTERM on a multi-host job: every host saves the same step and exits 143, whether the
signal reaches all hosts half a second apart (a slice being reclaimed) or one host only,
and a second SIGTERM while they stop changes nothing; the resumed job ends with the weights
of a job that never stopped, bit for bit. Real
processes over gloo, as launch/local.sh starts them."""

import signal
import time

import pytest
from launch_helpers import SMALL
from pod_helpers import (Hosts, assert_same_weights, checkpoint_steps, train_args,
                         wait_for_step)

from cardjax.config import load_config
from cardjax.data.prepare import prepare
from cardjax.train import exit_codes

pytestmark = pytest.mark.integration  # each case runs three two-host jobs: minutes


@pytest.fixture(scope="module")
def data_dir(tmp_path_factory):
  folder = tmp_path_factory.mktemp("data")
  prepare(load_config("configs/tiny_ar.py", [f"--config.data.data_dir={folder}", *SMALL]))
  return folder


@pytest.mark.parametrize("signalled", [(0, 1), (1,)], ids=["both_hosts", "one_host"])
def test_sigterm_saves_one_step_on_every_host_and_resumes_exactly(data_dir, tmp_path,
                                                                  signalled):
  run = tmp_path / "run"
  long = train_args(run, data_dir, 100_000, "--config.train.checkpoint_every=1000000",
                    "--config.train.log_every=1")
  hosts = Hosts(2, long, tmp_path / "logs_preempted")
  wait_for_step(run, 10, hosts)
  start = time.monotonic()
  for i, host in enumerate(signalled):
    if i:
      time.sleep(0.5)
    hosts.procs[host].send_signal(signal.SIGTERM)
  time.sleep(0.3)  # a second signal to the first host, while the hosts stop and save
  if hosts.procs[signalled[0]].poll() is None:
    hosts.procs[signalled[0]].send_signal(signal.SIGTERM)
  codes = hosts.wait(timeout=60)
  stopped = time.monotonic() - start
  assert codes == [exit_codes.PREEMPTED] * 2, hosts.tail()
  assert stopped < 60
  [saved] = checkpoint_steps(run)
  print(f"SIGTERM to hosts {signalled}: both saved step {saved} and exited 143 "
        f"{stopped:.1f} s after the first signal")
  for i in range(2):
    assert f"every host saved step {saved}" in hosts.output(i), hosts.tail()
  assert "collective" not in hosts.tail(100_000).lower()

  # The restarted job resumes at the saved step; a job that never stopped is its reference.
  end = saved + 4
  resumed = Hosts(2, train_args(run, data_dir, end), tmp_path / "logs_resumed")
  assert resumed.wait(timeout=400) == [0, 0], resumed.tail()
  assert f"resuming from step {saved}" in resumed.output(0)
  straight = Hosts(2, train_args(tmp_path / "straight", data_dir, end),
                   tmp_path / "logs_straight")
  assert straight.wait(timeout=400) == [0, 0], straight.tail()
  assert_same_weights(run, tmp_path / "straight")
