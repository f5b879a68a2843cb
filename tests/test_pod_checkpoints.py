"""A two-host job's checkpoint policy: time-based saves at steps both hosts agree on (a
mismatch would be a collective error or a hang), regular saves of which the newest is
kept, and milestones kept for good. Real processes over gloo."""

import re

import pytest
from launch_helpers import SMALL
from pod_helpers import Hosts, checkpoint_steps, train_args

from cardjax.config import load_config
from cardjax.data.prepare import prepare

pytestmark = pytest.mark.integration  # a two-host job

TIMED = re.compile(r"step (\d+): time-based checkpoint")


def test_timed_saves_agree_across_hosts_and_milestones_stay(tmp_path):
  data_dir = tmp_path / "data"
  prepare(load_config("configs/tiny_ar.py", [f"--config.data.data_dir={data_dir}", *SMALL]))
  args = train_args(tmp_path / "run", data_dir, 120, "--config.train.checkpoint_every=10",
                    "--config.train.keep_checkpoints=1", "--config.train.keep_every=50",
                    "--config.train.checkpoint_minutes=0.01")
  hosts = Hosts(2, args, tmp_path / "logs")
  assert hosts.wait(timeout=400) == [0, 0], hosts.tail()
  timed = [TIMED.findall(hosts.output(i)) for i in range(2)]
  assert timed[0] and timed[0] == timed[1], hosts.tail()
  # Milestones 50 and 100, and the newest (120, also the newest regular save); the
  # time-based saves were dropped as newer steps came.
  assert checkpoint_steps(tmp_path / "run") == [50, 100, 120]
