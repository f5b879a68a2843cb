"""Training runs whose workdir is a bucket (gs:// and s3://, on local emulators): a run
killed with SIGKILL resumes from the bucket as a local run would, its checkpoints export to
Hugging Face, a two-process job checkpoints there, and unusable buckets are clear errors."""

import json
import os
import subprocess
import time
from pathlib import Path

import jax
import numpy as np
import portpicker
import pytest
from flax import nnx

from cardjax import checkpoint
from cardjax.config import load_config
from cardjax.data.prepare import prepare
from cardjax.storage import as_path
from cardjax.train import train
from cloud_emulators import emulated
from launch_helpers import ROOT, SMALL, checkout_env, cli, two_process_env



@pytest.fixture(scope="module")
def data_dir(tmp_path_factory):
  root = tmp_path_factory.mktemp("data")
  prepare(load_config("configs/tiny_card.py", [f"--config.data.data_dir={root}", *SMALL]))
  return root


def _env(extra: dict, staging: Path) -> dict:
  return checkout_env({**os.environ, **extra, "CARDJAX_STAGING_DIR": str(staging)})


def _train_args(workdir, data_dir, steps, *extra):
  return cli("train", "--config", "configs/tiny_card.py", "--workdir", workdir,
              f"--config.data.data_dir={data_dir}", *SMALL, f"--config.train.steps={steps}",
              *extra)


def _params(run):
  model, _ = checkpoint.restore_model(f"{run}/checkpoints")
  return [np.asarray(p) for p in jax.tree.leaves(nnx.state(model, nnx.Param))]


TOTAL = 12  # steps of the killed-and-resumed runs and of the run that never stopped


@pytest.fixture(scope="module")
def straight(data_dir, tmp_path_factory):
  """(final loss, parameters) of a local run that never stopped, trained in this process
  (the same 8 simulated devices as the subprocesses, so the same reduction order)."""
  run = tmp_path_factory.mktemp("straight")
  result = train(load_config("configs/tiny_card.py", [
      f"--config.data.data_dir={data_dir}", *SMALL, f"--config.train.steps={TOTAL}"]), run)
  return result["train"]["loss"], _params(run)


@pytest.mark.integration  # a minute or more each on 2 cores: `make test-integration`
@pytest.mark.parametrize("scheme", ["gs", "s3"])
def test_killed_bucket_run_resumes_like_a_local_run(scheme, data_dir, straight, tmp_path,
                                                    monkeypatch):
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
    assert 2 <= latest < TOTAL
    model, step = checkpoint.restore_model(f"{run}/checkpoints")  # whole, not half-written
    assert step == latest
    done = subprocess.run(_train_args(run, data_dir, TOTAL), cwd=ROOT, text=True,
                          env=_env(env, tmp_path / "staging-2"), capture_output=True,
                          timeout=300)
    assert done.returncode == 0, done.stderr[-3000:]
    loss, params = straight
    assert f"resumed from step {latest}, trained {TOTAL - latest} steps to step {TOTAL}: " \
           f"loss {loss:.4f};" in done.stdout
    for a, b in zip(_params(run), params):
      np.testing.assert_array_equal(a, b)
    # The metrics reached the bucket (uploaded at each checkpoint and at the end), and the
    # restart continued them: it resumed, where a fresh start would log step 2 again.
    lines = [json.loads(l) for l in (as_path(run) / "metrics.jsonl").read_text().splitlines()]
    steps = [l["step"] for l in lines if "train/loss" in l]
    assert steps.count(2) == 1 and steps[-1] == TOTAL, steps
    assert any((as_path(run) / "tensorboard").iterdir())


@pytest.mark.integration  # 50 s on 2 cores: a bucket run trained, exported and read back
def test_bucket_run_exports_to_hugging_face(data_dir, tmp_path, monkeypatch, capsys):
  """export-hf reads a gs:// run and writes a local folder transformers loads (logits match)
  and a bucket folder, which import-hf reads back into a bucket checkpoint; generate reads
  the run."""
  import torch
  from transformers import AutoModelForCausalLM, AutoTokenizer

  from cardjax.cli import main

  with emulated("gs") as (_, root):
    monkeypatch.setenv("CARDJAX_STAGING_DIR", str(tmp_path / "staging"))
    run = f"{root}/run"
    train(load_config("configs/tiny_card.py", [f"--config.data.data_dir={data_dir}", *SMALL,
                                               "--config.train.steps=2"]), run)
    assert main(["export-hf", f"{run}/checkpoints", str(tmp_path / "hf")]) == 0
    assert main(["export-hf", f"{run}/checkpoints", f"{root}/hf"]) == 0
    assert (as_path(root) / "hf" / "config.json").is_file()
    assert main(["import-hf", f"{root}/hf", f"{root}/imported"]) == 0
    model, _ = checkpoint.restore_model(f"{run}/checkpoints")
    again, _ = checkpoint.restore_model(f"{root}/imported")
    # generate reads the run (its tokenizer from the bucket's hf_assets/) like a local one.
    capsys.readouterr()
    assert main(["generate", "--checkpoint", run, "--prompt", "def f(",
                 "--max-new-tokens", "4"]) == 0
    assert "method ar" in capsys.readouterr().out
  for a, b in zip(jax.tree.leaves(nnx.state(model, nnx.Param)),
                  jax.tree.leaves(nnx.state(again, nnx.Param))):
    np.testing.assert_array_equal(np.asarray(a), np.asarray(b))
  tokens = np.asarray(AutoTokenizer.from_pretrained(tmp_path / "hf")("def f(x): return x")[
      "input_ids"], dtype=np.int64)[None]
  assert tokens.size > 3  # the run's tokenizer came along (hf_assets/ on the bucket)
  hf_model = AutoModelForCausalLM.from_pretrained(tmp_path / "hf", dtype=torch.float32)
  with torch.no_grad():
    ref = hf_model.eval()(torch.tensor(tokens)).logits.numpy()
  np.testing.assert_allclose(ref, np.asarray(model(tokens)), atol=1e-4)


@pytest.mark.parametrize("scheme", ["gs", "s3"])
def test_an_unfinished_save_is_never_the_latest_step(scheme, tmp_path, monkeypatch):
  """A step counts once its last object is written (gs://: orbax's commit_success.txt;
  s3://: cardjax's marker, uploaded after every other file): a step cut short (SIGKILL,
  lost network) is invisible, and on s3:// uploading it again replaces it."""
  from cardjax.model import create_model
  from cardjax.config import model_config
  from cardjax.storage.staged import MARKER, StagedCheckpoints

  monkeypatch.setenv("CARDJAX_STAGING_DIR", str(tmp_path / "staging"))
  cfg = model_config(load_config("configs/tiny_card.py", SMALL))
  with emulated(scheme) as (_, root):
    ckpt = f"{root}/ckpt"
    checkpoint.save_model(ckpt, create_model(cfg, seed=0), step=1)
    staged = StagedCheckpoints(ckpt)
    checkpoint.save_model(tmp_path / "local", create_model(cfg, seed=1), step=2)
    step2 = tmp_path / "local" / "2"
    files = sorted(f for f in step2.rglob("*") if f.is_file() and f.parent != step2)
    for f in files[: len(files) // 2]:  # half of step 2's items, no commit file or marker
      rel = f.relative_to(tmp_path / "local").as_posix()
      (as_path(ckpt) / rel).parent.mkdir(parents=True, exist_ok=True)
      (as_path(ckpt) / rel).write_bytes(f.read_bytes())
    assert checkpoint.saved_steps(ckpt) == [1] and checkpoint.latest_step(ckpt) == 1
    _, step = checkpoint.restore_model(ckpt)
    assert step == 1
    if scheme == "gs":
      return
    # Saving step 2 for real replaces the half-written one; a new reader sees it whole.
    model2 = create_model(cfg, seed=2)
    checkpoint.save_model(ckpt, model2, step=2)
    assert (as_path(ckpt) / "2" / MARKER).is_file() and staged.committed().keys() == {1, 2}
    monkeypatch.setenv("CARDJAX_STAGING_DIR", str(tmp_path / "staging-reader"))
    restored, step = checkpoint.restore_model(ckpt)
  assert step == 2
  for a, b in zip(jax.tree.leaves(nnx.state(model2, nnx.Param)),
                  jax.tree.leaves(nnx.state(restored, nnx.Param))):
    np.testing.assert_array_equal(np.asarray(a), np.asarray(b))


# s3:// by default (cardjax's own staging, with process 0 uploading); gs:// (orbax writing
# from both processes) in `make test-slow`.
@pytest.mark.integration  # s3: `make test-integration`; gs is slow as well: `make test-slow`
@pytest.mark.parametrize("scheme", [pytest.param("gs", marks=pytest.mark.slow), "s3"])
def test_two_process_job_checkpoints_to_a_bucket_and_resumes(scheme, data_dir, tmp_path):
  """launch/local.sh's two processes (gloo on CPU) train into a bucket, each writes its
  data-iterator state there, and a second launch resumes from it."""
  with emulated(scheme) as (env, root):
    run = f"{root}/run"
    environ = two_process_env(_env(env, tmp_path / "staging"))
    for steps, every in ((4, 4), (6, 100)):
      cmd = [str(ROOT / "launch" / "local.sh"), "2", "2",
             *_train_args(run, data_dir, steps, f"--config.train.checkpoint_every={every}")]
      result = subprocess.run(cmd, env=environ, cwd=ROOT, capture_output=True, text=True,
                              timeout=400)
      assert result.returncode == 0, (result.stdout + result.stderr)[-4000:]
      if steps == 4:
        data = as_path(f"{run}/checkpoints/4/data")
        assert sorted(p.name for p in data.iterdir() if p.name.endswith(".json")) == [
            "shard_0-of-2.json", "shard_1-of-2.json"]
    assert checkpoint.saved_steps(f"{run}/checkpoints")[-1] == 6
    lines = [json.loads(l) for l in (as_path(run) / "metrics.jsonl").read_text().splitlines()]
    # Only process 0 writes; the second launch resumed at 4 (no second step-2 line).
    assert [l["step"] for l in lines if "train/loss" in l] == [2, 4, 6]


def _closed_port() -> int:
  return portpicker.pick_unused_port()


def _fails(argv, capsys) -> str:
  """The one-line error `cardjax ARGV` prints (status 2, no traceback), within seconds."""
  from cardjax.cli import main

  capsys.readouterr()
  start = time.time()
  assert main(argv) == 2
  assert time.time() - start < 20, "a storage check retried instead of failing fast"
  err = capsys.readouterr().err
  assert err.startswith("cardjax: error: ") and "Traceback" not in err, err
  return err


def test_unusable_buckets_are_one_clear_error_before_any_work(tmp_path, monkeypatch, capsys):
  """Each fails in the CLI before a dataset build (the data dir does not exist) or a
  compile: an endpoint nobody listens on, no credentials, no such bucket."""
  train = lambda workdir: ["train", "--config", "configs/tiny_card.py", "--workdir", workdir,
                           f"--config.data.data_dir={tmp_path / 'never-built'}"]
  for k in ("STORAGE_EMULATOR_HOST", "TENSORSTORE_GCS_HTTP_URL", "AWS_ENDPOINT_URL",
            "AWS_ENDPOINT_URL_S3", "AWS_ACCESS_KEY_ID", "AWS_SECRET_ACCESS_KEY", "AWS_PROFILE",
            "AWS_SESSION_TOKEN", "GOOGLE_APPLICATION_CREDENTIALS"):
    monkeypatch.delenv(k, raising=False)
  # No credentials of either kind (and no cloud VM's metadata server to ask).
  monkeypatch.setenv("AWS_SHARED_CREDENTIALS_FILE", str(tmp_path / "none"))
  monkeypatch.setenv("AWS_CONFIG_FILE", str(tmp_path / "none"))
  monkeypatch.setenv("AWS_EC2_METADATA_DISABLED", "true")
  monkeypatch.setenv("CLOUDSDK_CONFIG", str(tmp_path / "gcloud"))
  monkeypatch.setenv("NO_GCE_CHECK", "true")
  assert "no AWS credentials" in _fails(train("s3://b/run"), capsys)
  assert "no Google Cloud credentials" in _fails(train("gs://b/run"), capsys)
  # Endpoints nobody listens on.
  url = f"http://127.0.0.1:{_closed_port()}"
  monkeypatch.setenv("STORAGE_EMULATOR_HOST", url)
  assert "TENSORSTORE_GCS_HTTP_URL" in _fails(train("gs://b/run"), capsys)
  monkeypatch.setenv("TENSORSTORE_GCS_HTTP_URL", url)
  err = _fails(train("gs://b/run"), capsys)
  assert f"gs://b: cannot reach the gs:// endpoint {url} " in err
  assert "correct STORAGE_EMULATOR_HOST" in err
  monkeypatch.setenv("AWS_ENDPOINT_URL", url)
  monkeypatch.setenv("AWS_ACCESS_KEY_ID", "testing")
  monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", "testing")
  err = _fails(train("s3://b/run"), capsys)
  assert f"s3://b: cannot reach the s3:// endpoint {url} " in err
  assert "correct AWS_ENDPOINT_URL" in err
  assert "cannot reach" in _fails(["export-hf", str(tmp_path), "s3://b/hf"], capsys)
  # Buckets that do not exist.
  for scheme in ("gs", "s3"):
    with emulated(scheme):
      assert f"{scheme}://no-such-bucket: no such bucket" in _fails(
          train(f"{scheme}://no-such-bucket/run"), capsys)
  assert not (tmp_path / "never-built").exists()
