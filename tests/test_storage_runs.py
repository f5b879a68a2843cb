"""Training runs whose workdir is a bucket (gs:// and s3://, on local emulators): a run
killed with SIGKILL resumes from the bucket as a local run would, its checkpoints export to
Hugging Face, a two-process job checkpoints there, and unusable buckets are clear errors."""

import json
import os
import subprocess
import sys
import time
from pathlib import Path

import jax
import numpy as np
import pytest
from flax import nnx

from cardjax import checkpoint
from cardjax.config import load_config
from cardjax.data.prepare import prepare
from cardjax.storage import as_path
from cardjax.train import train
from cloud_emulators import emulated

ROOT = Path(__file__).resolve().parents[1]
SMALL = ["--config.data.options.max_files=40", "--config.data.options.validation_percent=10",
         "--config.data.seq_len=32", "--config.data.batch_size=8", "--config.train.log_every=2",
         "--config.train.progress=false", "--config.train.eval_steps=1",
         "--config.train.eval_every=0", "--config.model.hidden_size=32",
         "--config.model.intermediate_size=64", "--config.train.schedule=constant"]


@pytest.fixture(scope="module")
def data_dir(tmp_path_factory):
  root = tmp_path_factory.mktemp("data")
  prepare(load_config("configs/tiny_card.py", [f"--config.data.data_dir={root}", *SMALL]))
  return root


def _cli(*args) -> list[str]:
  """`cardjax ARGS` running this checkout (the repo's .venv or a worktree's PYTHONPATH)."""
  return [sys.executable, "-m", "cardjax.cli", *map(str, args)]


def _env(extra: dict, staging: Path) -> dict:
  return {**os.environ, **extra, "CARDJAX_STAGING_DIR": str(staging),
          "PYTHONPATH": os.pathsep.join([str(ROOT), os.environ.get("PYTHONPATH", "")])}


def _train_args(workdir, data_dir, steps, *extra):
  return _cli("train", "--config", "configs/tiny_card.py", "--workdir", workdir,
              f"--config.data.data_dir={data_dir}", *SMALL, f"--config.train.steps={steps}",
              *extra)


def _params(run):
  model, _ = checkpoint.restore_model(f"{run}/checkpoints")
  return [np.asarray(p) for p in jax.tree.leaves(nnx.state(model, nnx.Param))]


@pytest.mark.parametrize("scheme", ["gs", "s3"])
def test_killed_bucket_run_resumes_like_a_local_run(scheme, data_dir, tmp_path, monkeypatch):
  """SIGKILL while a checkpoint is saved every step: the bucket's latest step is whole, and
  a restart (on a fresh staging folder: nothing local carried over) resumes from it to the
  loss and parameters of a run that never stopped."""
  with emulated(scheme) as (env, root):
    monkeypatch.setenv("CARDJAX_STAGING_DIR", str(tmp_path / "staging-test"))
    run = f"{root}/run"
    proc = subprocess.Popen(
        _train_args(run, data_dir, 400, "--config.train.checkpoint_every=1",
                    "--config.train.keep_checkpoints=2"),
        env=_env(env, tmp_path / "staging-1"), cwd=ROOT, stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL)
    deadline = time.time() + 240
    while time.time() < deadline and len(checkpoint.saved_steps(f"{run}/checkpoints")) < 2:
      time.sleep(0.1)
    time.sleep(0.3)  # into a later save
    proc.kill()
    proc.wait(timeout=60)
    latest = checkpoint.latest_step(f"{run}/checkpoints")
    assert 2 <= latest < 400
    model, step = checkpoint.restore_model(f"{run}/checkpoints")  # whole, not half-written
    assert step == latest
    done = subprocess.run(_train_args(run, data_dir, latest + 2), cwd=ROOT, text=True,
                          env=_env(env, tmp_path / "staging-2"), capture_output=True,
                          timeout=300)
    assert done.returncode == 0, done.stderr[-3000:]
    resumed = _params(run)
    # The run that never stopped: in this process (the same 8 simulated devices as the
    # subprocesses, so the same reduction order).
    straight = train(load_config("configs/tiny_card.py", [
        f"--config.data.data_dir={data_dir}", *SMALL, f"--config.train.steps={latest + 2}"]),
        tmp_path / "straight")
    assert f"loss {straight['train']['loss']:.4f};" in done.stdout
    for a, b in zip(resumed, _params(tmp_path / "straight")):
      np.testing.assert_array_equal(a, b)
    # The metrics reached the bucket (uploaded at each checkpoint and at the end), and the
    # restart continued them: it resumed, where a fresh start would log step 2 again.
    lines = [json.loads(l) for l in (as_path(run) / "metrics.jsonl").read_text().splitlines()]
    steps = [l["step"] for l in lines if "train/loss" in l]
    assert steps.count(2) == 1 and steps[-1] == latest + 2, steps
    assert any((as_path(run) / "tensorboard").iterdir())
