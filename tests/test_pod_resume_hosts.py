"""A training run resumes on another number of hosts: saved by two processes and resumed
by one, and the other way round. The data shards' states at the end are where a run that
never changed hosts has its data (every row read once), and the weights match that run's
(up to the order of the cross-host gradient sum). Real processes over gloo."""

import json
import os
import subprocess
from pathlib import Path

import numpy as np
import pytest
from launch_helpers import ROOT, SMALL, cli, two_process_env
from pod_helpers import Hosts, final_params, train_args

from cardjax.config import load_config
from cardjax.data.prepare import make_loader, prepare

pytestmark = pytest.mark.integration  # four training processes per case


def _one_process(args, log: Path) -> None:
  env = {k: v for k, v in two_process_env(dict(os.environ)).items()
         if not k.startswith("CARDJAX_")}
  with open(log, "w") as out:
    code = subprocess.run(cli("train", *args), env=env, cwd=ROOT, stdout=out,
                          stderr=subprocess.STDOUT, timeout=400).returncode
  assert code == 0, log.read_text()[-3000:]


def _two_processes(args, logs: Path) -> None:
  hosts = Hosts(2, args, logs)
  assert hosts.wait(timeout=400) == [0, 0], hosts.tail()


@pytest.mark.parametrize("before,after", [(2, 1), (1, 2)], ids=["2_to_1", "1_to_2"])
def test_a_run_resumes_on_another_host_count(tmp_path, before, after):
  data_dir = tmp_path / "data"
  config = load_config("configs/tiny_ar.py", [f"--config.data.data_dir={data_dir}", *SMALL,
                                              "--config.data.shards=2"])
  prepare(config)
  run = tmp_path / "run"
  common = ("--config.data.shards=2", "--config.train.checkpoint_every=100")
  start = {1: _one_process, 2: _two_processes}
  start[before](train_args(run, data_dir, 6, *common), tmp_path / "first.log")
  start[after](train_args(run, data_dir, 10, *common), tmp_path / "second.log")
  logs = tmp_path / "second.log"
  text = (logs / "host_0.log" if logs.is_dir() else logs).read_text()
  assert "resuming from step 6 of 10" in text

  # Where a run that never changed hosts has its data after 10 steps: the same state per
  # shard, so the 10 global batches were those rows, each read once.
  with make_loader(config, process_index=0, process_count=1) as loader:
    for _ in range(10):
      next(loader)
    want = loader.shard_states()
  saved = run / "checkpoints" / "10" / "data"
  assert sorted(p.name for p in saved.glob("*.json")) == ["shard_0-of-2.json",
                                                          "shard_1-of-2.json"]
  for shard in (0, 1):
    assert json.loads((saved / f"shard_{shard}-of-2.json").read_text()) == want[shard]

  _one_process(train_args(tmp_path / "straight", data_dir, 10, *common),
               tmp_path / "straight.log")
  for a, b in zip(final_params(run), final_params(tmp_path / "straight"), strict=True):
    np.testing.assert_allclose(a, b, rtol=2e-4, atol=2e-6)
