"""`cardjax train` as two real processes (launch/local.sh, gloo on CPU): it trains, writes
one checkpoint with a data-iterator file per process, and resumes exactly."""

import json
import os
import subprocess
from pathlib import Path

import numpy as np
import pytest
from launch_helpers import ROOT, SMALL, cli, two_process_env

from cardjax.config import load_config
from cardjax.data.prepare import make_loader, prepare

# Over a minute each on 2 cores: `make test-integration` runs them (CI too), not
# `make test`.
pytestmark = pytest.mark.integration

def _launch(workdir, data_dir, steps, checkpoint_every):
  env = two_process_env(dict(os.environ))
  cmd = [str(ROOT / "launch" / "local.sh"), "2", "2", *cli(
      "train", "--config", "configs/tiny_ar.py", "--workdir", workdir,
      f"--config.data.data_dir={data_dir}", *SMALL, f"--config.train.steps={steps}",
      f"--config.train.checkpoint_every={checkpoint_every}")]
  result = subprocess.run(cmd, env=env, cwd=ROOT, capture_output=True, text=True, timeout=400)
  assert result.returncode == 0, (result.stdout + result.stderr)[-4000:]
  return result


def _final_params(workdir):
  from cardjax import checkpoint
  import jax
  from flax import nnx
  model, _ = checkpoint.restore_model(Path(workdir) / "checkpoints")
  return [np.asarray(p) for p in jax.tree.leaves(nnx.state(model, nnx.Param))]


def test_two_process_training_checkpoints_and_resumes(tmp_path):
  data_dir = tmp_path / "data"
  config = load_config("configs/tiny_ar.py", [f"--config.data.data_dir={data_dir}", *SMALL])
  prepare(config)
  _launch(tmp_path / "split", data_dir, steps=4, checkpoint_every=4)
  step4 = tmp_path / "split" / "checkpoints" / "4" / "data"
  assert sorted(p.name for p in step4.iterdir() if p.suffix == ".json") == [
      "shard_0-of-2.json", "shard_1-of-2.json"]
  # Each host wrote the state its own shard reached after 4 steps. (The two states need not
  # differ: they count positions within each shard, and when both shards are still inside
  # their first, long document, as with Python 3.12's stdlib, they are equal.)
  for i in range(2):
    with make_loader(config, process_index=i, process_count=2) as loader:
      for _ in range(4):
        next(loader)
      assert json.loads((step4 / f"shard_{i}-of-2.json").read_text()) == \
          loader.shard_states()[i]
  _launch(tmp_path / "split", data_dir, steps=6, checkpoint_every=100)  # resumes at 4
  _launch(tmp_path / "straight", data_dir, steps=6, checkpoint_every=100)
  for a, b in zip(_final_params(tmp_path / "split"), _final_params(tmp_path / "straight")):
    np.testing.assert_array_equal(a, b)
  lines = [json.loads(l) for l in (tmp_path / "straight" / "metrics.jsonl").open()]
  # Only process 0 writes: 3 train lines (steps 2, 4, 6) and the final validation.
  assert [l["step"] for l in lines] == [2, 4, 6, 6] and "eval/ar_nll" in lines[-1]
