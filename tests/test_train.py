"""The trainer run: exact resume, SIGTERM, NaN, bad configs, kills during saves, init from HF
or orbax, the compilation cache and unreadable checkpoints (the step itself is
tests/test_train_step.py)."""

import gc
import json
import os
import signal
import subprocess
import sys
import time

import jax
import numpy as np
import pytest
from flax import nnx

from cardjax import checkpoint
from cardjax.config import model_config
from cardjax.errors import CheckpointError, ConfigError
from cardjax.model import create_model
from cardjax.objectives import make_objective
from cardjax.parallel import make_mesh
from cardjax.train import TrainingError, loop, train, validation
from cardjax.train.checkpointing import TrainCheckpointer
from cardjax.train.optimizer import make_optimizer, sharded_init
from conftest import CHEAP_COMPILE_FLAGS

from train_helpers import SMALL, prepare_small, restored_params as _params, small_config as _config


@pytest.fixture(scope="module")
def data_dir(tmp_path_factory):
  return prepare_small(tmp_path_factory.mktemp("data"))


def test_loss_falls_and_resume_is_exact(data_dir, tmp_path):
  full = train(_config(data_dir, "--config.train.steps=8", "--config.train.checkpoint_every=4"),
               tmp_path / "full")
  lines = [json.loads(l) for l in open(tmp_path / "full" / "metrics.jsonl")]
  losses = [l["train/loss"] for l in lines if "train/loss" in l]
  assert losses[-1] < losses[0]
  assert full["eval"]["ar_nll"] > 0 and (tmp_path / "full" / "tensorboard").is_dir()
  # N steps, stop, then resume to 2N: the same parameters as 2N straight through.
  train(_config(data_dir, "--config.train.steps=8", "--config.train.checkpoint_every=4",
                "--config.train.eval_every=0"), tmp_path / "split")
  for a, b in zip(_params(tmp_path / "full"), _params(tmp_path / "split")):
    np.testing.assert_array_equal(np.asarray(a), np.asarray(b))
  import shutil
  shutil.rmtree(tmp_path / "split" / "checkpoints" / "8")  # as if killed after step 4
  train(_config(data_dir, "--config.train.steps=8", "--config.train.checkpoint_every=4"),
        tmp_path / "split")
  for a, b in zip(_params(tmp_path / "full"), _params(tmp_path / "split")):
    np.testing.assert_array_equal(np.asarray(a), np.asarray(b))


@pytest.mark.integration  # 45 s on 2 cores: two trainings and a resume
def test_resume_allocates_only_what_it_restores(data_dir, tmp_path, monkeypatch):
  """A resumed run initialises nothing (no random model, no optimizer state): no array
  exists before the restore, every restored array has the sharding a fresh run gives it,
  and on a data x fsdp x tensor mesh the resumed run equals the straight one."""
  run = ["--config.mesh.data=2", "--config.mesh.fsdp=2", "--config.mesh.tensor=2",
         "--config.train.checkpoint_every=2", "--config.train.eval_every=0"]
  train(_config(data_dir, *run, "--config.train.steps=2"), tmp_path / "split")
  real_restore, restored = TrainCheckpointer.restore, {}

  def restore(self, *args):
    gc.collect()
    assert [a.shape for a in jax.live_arrays() if id(a) not in before] == []
    out = real_restore(self, *args)
    restored["params"], restored["opt_state"] = jax.tree.map(lambda x: x.sharding, out)
    return out

  def no_init(*_, **__):
    raise AssertionError("a resumed run must not initialise the model")

  monkeypatch.setattr(loop, "create_model", no_init)
  monkeypatch.setattr(loop, "_init_model", no_init)
  monkeypatch.setattr(TrainCheckpointer, "restore", restore)
  gc.collect()
  before = {id(a) for a in jax.live_arrays()}
  config = _config(data_dir, *run, "--config.train.steps=4")
  train(config, tmp_path / "split")
  monkeypatch.undo()
  assert restored, "the second run did not resume"
  # A fresh start's shardings: create_model's, then the optimizer init's.
  mesh = make_mesh(2, 2, 2)
  with jax.set_mesh(mesh):
    params = nnx.split(create_model(model_config(config), mesh=mesh), nnx.Param)[1]
    params = params.to_pure_dict()
    opt_state = sharded_init(make_optimizer(config.train, params), params, mesh)(params)
  for got, fresh in ((restored["params"], params), (restored["opt_state"], opt_state)):
    want = jax.tree.map(lambda x: x.sharding, fresh)
    assert jax.tree.structure(got) == jax.tree.structure(want)
    assert all(a == b for a, b in zip(jax.tree.leaves(got), jax.tree.leaves(want)))
  assert {"fsdp", "tensor"} <= {axis for s in jax.tree.leaves(restored["params"])
                                for axis in jax.tree.leaves(tuple(s.spec))}
  train(config, tmp_path / "straight")
  for a, b in zip(_params(tmp_path / "split"), _params(tmp_path / "straight")):
    np.testing.assert_array_equal(np.asarray(a), np.asarray(b))


def test_validations_score_the_same_batches_from_one_loader(data_dir, tmp_path, monkeypatch):
  """Each validation of a run scores the first eval_steps batches of the unshuffled split,
  read by one loader per run."""
  real_make_loader, real_to_global = loop.make_loader, validation.to_global
  splits, scored = [], []

  def make_loader(config, split=None, **changes):
    splits.append(split or config.data.split)
    return real_make_loader(config, split=split, **changes)

  def to_global(batch, mesh):  # validation.py's use of it: validation batches
    scored.append({k: v.copy() for k, v in batch.items()})
    return real_to_global(batch, mesh)

  monkeypatch.setattr(loop, "make_loader", make_loader)  # the training split's
  monkeypatch.setattr(validation, "make_loader", make_loader)
  monkeypatch.setattr(validation, "to_global", to_global)
  config = _config(data_dir, "--config.train.steps=4", "--config.train.eval_every=2",
                   "--config.train.eval_steps=2", "--config.train.checkpoint_every=100")
  train(config, tmp_path)
  assert sorted(splits) == ["train", "validation"]
  evals = [l["step"] for l in map(json.loads, open(tmp_path / "metrics.jsonl"))
           if "eval/ar_nll" in l]
  assert evals == [2, 4] and len(scored) == 4
  with real_make_loader(config, split="validation", shuffle=False) as fresh:
    first = [next(fresh) for _ in range(2)]
  for got, want in zip(scored, first + first):
    for k in want:
      np.testing.assert_array_equal(got[k], want[k])


def test_nan_loss_stops_and_keeps_the_last_good_checkpoint(data_dir, tmp_path):
  config = _config(data_dir, "--config.train.steps=40", "--config.train.checkpoint_every=2",
                   "--config.train.lr=1e12", "--config.train.grad_clip=0",
                   "--config.train.warmup_steps=1", "--config.train.schedule=constant")
  with pytest.raises(TrainingError, match="loss became (nan|inf).*last good checkpoint is step"):
    train(config, tmp_path)
  good = checkpoint.latest_step(tmp_path / "checkpoints")
  model, _ = checkpoint.restore_model(tmp_path / "checkpoints")
  assert all(np.isfinite(np.asarray(p)).all() for p in jax.tree.leaves(nnx.state(model)))
  assert good >= 2


@pytest.mark.integration  # 30 s on 2 cores: a training process stopped by SIGTERM, then resumed
def test_sigterm_saves_and_resume_matches(data_dir, tmp_path):
  args = [sys.executable, "-m", "cardjax.cli", "train", "--config", "configs/tiny_ar.py",
          "--workdir", str(tmp_path / "run"), f"--config.data.data_dir={data_dir}", *SMALL,
          "--config.train.steps=400", "--config.train.checkpoint_every=1000",
          "--config.train.eval_every=0", "--config.train.schedule=constant"]
  # The same 8 simulated devices as this process (conftest's XLA_FLAGS), so that the
  # stopped run, the resumed run and the straight run reduce in the same order.
  proc = subprocess.Popen(args, env=dict(os.environ), stdout=subprocess.PIPE,
                          stderr=subprocess.STDOUT, text=True)
  metrics = tmp_path / "run" / "metrics.jsonl"
  deadline = time.time() + 240
  while time.time() < deadline and not (metrics.exists() and metrics.read_text().count("\n") >= 2):
    time.sleep(0.2)
  proc.send_signal(signal.SIGTERM)
  out, _ = proc.communicate(timeout=240)
  assert proc.returncode == 143, out[-2000:]
  assert "preempted (SIGTERM): this process saved step" in out
  stopped = checkpoint.latest_step(tmp_path / "run" / "checkpoints")
  assert 4 <= stopped < 400
  # Resuming continues from that step exactly as a run that never stopped (fewer total
  # steps for speed; the constant schedule does not depend on the total).
  same = [f"--config.train.steps={stopped + 2}", "--config.train.checkpoint_every=1000",
          "--config.train.eval_every=0", "--config.train.schedule=constant"]
  train(_config(data_dir, *same), tmp_path / "run")
  train(_config(data_dir, *same), tmp_path / "straight")
  for a, b in zip(_params(tmp_path / "run"), _params(tmp_path / "straight")):
    np.testing.assert_array_equal(np.asarray(a), np.asarray(b))


def test_bad_configs_are_clear_errors(data_dir):
  with pytest.raises(ConfigError, match="objective.name='mystery'"):
    make_objective(_config(data_dir, "--config.objective.name=mystery").objective,
                   model_config(_config(data_dir)))
  with pytest.raises(ConfigError, match="block_size=5 must divide data.seq_len=32"):
    _config(data_dir, "--config.objective.name=mars", "--config.objective.block_size=5")
  with pytest.raises(ConfigError, match="grad_accum=3 must divide"):
    _config(data_dir, "--config.train.grad_accum=3")


@pytest.mark.integration  # 20 s on 2 cores: training processes killed during saves
def test_kill_during_saves_leaves_a_restorable_latest(data_dir, tmp_path):
  """SIGKILL while checkpoints are written every step: the latest step is always whole."""
  args = [sys.executable, "-m", "cardjax.cli", "train", "--config", "configs/tiny_ar.py",
          "--workdir", str(tmp_path / "run"), f"--config.data.data_dir={data_dir}", *SMALL,
          "--config.train.steps=400", "--config.train.checkpoint_every=1",
          "--config.train.keep_checkpoints=2", "--config.train.eval_every=0"]
  proc = subprocess.Popen(args, env=dict(os.environ), stdout=subprocess.DEVNULL,
                          stderr=subprocess.DEVNULL)
  ckpts = tmp_path / "run" / "checkpoints"
  deadline = time.time() + 240
  while time.time() < deadline and not (ckpts.exists() and len(list(ckpts.iterdir())) >= 3):
    time.sleep(0.05)
  proc.kill()
  proc.wait(timeout=60)
  latest = checkpoint.latest_step(ckpts)
  model, step = checkpoint.restore_model(ckpts)
  assert step == latest >= 1
  assert all(np.isfinite(np.asarray(p)).all() for p in jax.tree.leaves(nnx.state(model)))
  # And training resumes from it.
  result = train(_config(data_dir, f"--config.train.steps={latest + 1}",
                         "--config.train.eval_every=0"), tmp_path / "run")
  assert result["step"] == latest + 1


def test_init_from_hf_and_orbax_and_bf16(data_dir, tmp_path):
  """MARS starts from a HF model (the Qwen recipe) or from stage 1's orbax checkpoint."""
  from cardjax import hf

  config = _config(data_dir, "--config.train.steps=2", "--config.train.eval_every=0")
  source = create_model(model_config(config), seed=7)
  hf.save_pretrained(source, tmp_path / "hf")
  start = _config(data_dir, "--config.train.steps=1", "--config.train.lr=1e-9",
                  f"--config.train.init_from={tmp_path / 'hf'}", "--config.train.eval_every=0")
  train(start, tmp_path / "from_hf")
  for a, b in zip(_params(tmp_path / "from_hf"), jax.tree.leaves(nnx.state(source, nnx.Param))):
    np.testing.assert_allclose(np.asarray(a), np.asarray(b), atol=1e-6)  # lr ~ 0: unchanged
  stage2 = _config(data_dir, "--config.train.steps=2", "--config.objective.name=mars",
                   f"--config.train.init_from={tmp_path / 'from_hf' / 'checkpoints'}",
                   "--config.model.dtype=bfloat16", "--config.train.eval_every=0")
  result = train(stage2, tmp_path / "mars")
  assert np.isfinite(result["train"]["loss"])
  model, _ = checkpoint.restore_model(tmp_path / "mars" / "checkpoints")
  assert model.cfg.dtype == "bfloat16"
  assert all(np.asarray(p).dtype == np.float32 for p in jax.tree.leaves(nnx.state(model)))


def test_the_run_keeps_its_tokenizer_for_export_and_generate(data_dir, tmp_path, capsys,
                                                             monkeypatch):
  """The trainer copies the run's tokenizer next to its checkpoints: export-hf writes a
  folder whose tokenizer transformers loads, and generate reads it without the data dir."""
  from transformers import AutoTokenizer

  import importlib

  from cardjax.cli import main
  from cardjax.data.prepare import load_data_tokenizer

  prepare_module = importlib.import_module("cardjax.data.prepare")  # the package shadows it

  config = _config(data_dir, "--config.train.steps=2")
  train(config, tmp_path / "run")
  ckpt = tmp_path / "run" / "checkpoints"
  assert (ckpt / checkpoint.ASSETS / "tokenizer.json").is_file()
  assert main(["export-hf", str(ckpt), str(tmp_path / "hf")]) == 0
  text = "def f(x):\n    return x + 1\n"
  ids = load_data_tokenizer(config).encode(text)
  assert AutoTokenizer.from_pretrained(tmp_path / "hf")(text)["input_ids"] == ids

  def no_data_dir(_):
    raise AssertionError("generate read the data dir's tokenizer")

  monkeypatch.setattr(prepare_module, "load_data_tokenizer", no_data_dir)
  capsys.readouterr()
  assert main(["generate", "--checkpoint", str(tmp_path / "run"), "--prompt", "def f(",
               "--max-new-tokens", "4"]) == 0
  assert "method ar" in capsys.readouterr().out


def test_compilation_cache_dir_keeps_the_compiled_step(data_dir, tmp_path):
  """train.compilation_cache_dir: the first run writes the compiled step there (in a fresh
  process: the test session's own cache is already set up)."""
  cache = tmp_path / "xla-cache"
  args = [sys.executable, "-m", "cardjax.cli", "train", "--config", "configs/tiny_ar.py",
          "--workdir", str(tmp_path / "run"), f"--config.data.data_dir={data_dir}", *SMALL,
          "--config.train.steps=2", "--config.train.eval_every=0",
          f"--config.train.compilation_cache_dir={cache}"]
  env = {k: v for k, v in os.environ.items() if not k.startswith("JAX_COMPILATION_CACHE")}
  # XLA's default compile, as a user's: the trainer caches programs that took a second or
  # more to compile, and the suite's cheaper compiles (conftest.py) bring the tiny step
  # under that.
  env["XLA_FLAGS"] = " ".join(f for f in env.get("XLA_FLAGS", "").split()
                              if f.split("=")[0] not in CHEAP_COMPILE_FLAGS)
  proc = subprocess.run(args, env=env, capture_output=True, text=True, timeout=300)
  assert proc.returncode == 0, proc.stderr[-2000:]
  assert any(cache.iterdir()), "no compiled program was cached"


RESUMABLE = ("--config.train.checkpoint_every=2", "--config.train.keep_checkpoints=5",
             "--config.train.eval_every=0", "--config.train.schedule=constant")


def _damage(step_dir):
  """Zero the first 4 KB of each params data file (as a bad disk would)."""
  for f in (step_dir / "params").glob("ocdbt.process_*/d/*"):
    data = bytearray(f.read_bytes())
    data[:4096] = bytes(len(data[:4096]))
    f.write_bytes(bytes(data))


def test_an_unreadable_latest_is_one_error_and_resume_step_goes_on(data_dir, tmp_path,
                                                                    capsys):
  """A damaged newest checkpoint: one error naming the step, the part and the way on
  (train.resume_step); that way resumes from the older step to the parameters of a run
  that never stopped, with the damaged step set aside, not deleted."""
  run = tmp_path / "run"
  train(_config(data_dir, "--config.train.steps=6", *RESUMABLE), run)
  _damage(run / "checkpoints" / "6")
  with pytest.raises(CheckpointError) as e:
    train(_config(data_dir, "--config.train.steps=8", *RESUMABLE), run)
  message = str(e.value)
  assert "checkpoint step 6" in message and "its params failed" in message, message
  assert "--config.train.resume_step=4" in message and "\n" not in message
  out = train(_config(data_dir, "--config.train.steps=8", "--config.train.resume_step=4",
                      *RESUMABLE), run)
  assert out["start"] == 4 and "resuming from step 4 of 8" in capsys.readouterr().out
  assert (run / "checkpoints_set_aside" / "6").is_dir()
  train(_config(data_dir, "--config.train.steps=8", *RESUMABLE), tmp_path / "straight")
  for a, b in zip(_params(run), _params(tmp_path / "straight")):
    np.testing.assert_array_equal(np.asarray(a), np.asarray(b))
  with pytest.raises(CheckpointError, match=r"resume_step=3: .* has steps \[2, 4, 6, 8\]"):
    train(_config(data_dir, "--config.train.steps=10", "--config.train.resume_step=3",
                  *RESUMABLE), run)
