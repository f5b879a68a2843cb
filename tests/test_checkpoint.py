"""Orbax model checkpoints: exact round trips, sharded restore, and clear failures."""

import shutil

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx

from cardjax import checkpoint
from cardjax.errors import CheckpointError
from cardjax.model import ModelConfig, create_model
from cardjax.parallel import make_mesh

CFG = ModelConfig(vocab_size=256, hidden_size=64, intermediate_size=128, num_layers=2,
                  num_heads=4, num_kv_heads=2)


def _params(model):
  return jax.tree.leaves(nnx.state(model, nnx.Param))


@pytest.mark.parametrize("scan", [False, True])
def test_save_restore_is_exact(tmp_path, scan):
  cfg = ModelConfig(**{**CFG.to_dict(), "scan_layers": scan})
  model = create_model(cfg, seed=3)
  checkpoint.save_model(tmp_path, model, step=4)
  restored, step = checkpoint.restore_model(tmp_path)
  assert step == 4 and restored.cfg == cfg
  for a, b in zip(_params(model), _params(restored)):
    np.testing.assert_array_equal(np.asarray(a), np.asarray(b))


def test_latest_step_and_interrupted_save(tmp_path):
  model = create_model(CFG, seed=0)
  checkpoint.save_model(tmp_path, model, step=1)
  checkpoint.save_model(tmp_path, create_model(CFG, seed=1), step=2)
  assert checkpoint.latest_step(tmp_path) == 2
  # A save killed half way leaves orbax's temporary folder; it must never count as latest.
  shutil.copytree(tmp_path / "2", tmp_path / "9.orbax-checkpoint-tmp-123")
  assert checkpoint.latest_step(tmp_path) == 2
  assert checkpoint.saved_steps(tmp_path) == [1, 2]
  restored, step = checkpoint.restore_model(tmp_path, step=1)
  assert step == 1
  np.testing.assert_array_equal(np.asarray(restored.embed[...]), np.asarray(model.embed[...]))


def test_saved_steps_of_a_run_stopped_before_its_first_save(tmp_path):
  assert checkpoint.saved_steps(tmp_path / "missing") == []
  (tmp_path / "hf_assets").mkdir()  # what a run writes first, before any step
  assert checkpoint.saved_steps(tmp_path) == []


def test_restore_into_mesh_shards_parameters(tmp_path):
  model = create_model(CFG, seed=0)
  checkpoint.save_model(tmp_path, model)
  mesh = make_mesh(2, 2, 2)
  restored, _ = checkpoint.restore_model(tmp_path, mesh=mesh)
  q = restored.layers[0].attn.q[...]
  assert q.sharding.spec == jax.sharding.PartitionSpec("fsdp", "tensor", None)
  assert q.addressable_shards[0].data.shape == (32, 2, 16)
  tokens = jnp.arange(32, dtype=jnp.int32).reshape(4, 8)
  with jax.set_mesh(mesh):
    out = nnx.jit(lambda m, t: m(t))(restored, tokens)
  np.testing.assert_allclose(np.asarray(out), np.asarray(model(tokens)), atol=1e-5)


def test_runtime_overrides_allowed_structural_refused(tmp_path):
  checkpoint.save_model(tmp_path, create_model(CFG, seed=0))
  model, _ = checkpoint.restore_model(tmp_path, dtype="bfloat16", remat="full")
  assert model.cfg.dtype == "bfloat16" and model.cfg.remat == "full"
  with pytest.raises(CheckpointError, match="saved with model.num_layers=2"):
    checkpoint.restore_model(tmp_path, num_layers=3)


def test_missing_and_empty_checkpoints(tmp_path):
  with pytest.raises(CheckpointError, match="does not exist"):
    checkpoint.restore_model(tmp_path / "nope")
  (tmp_path / "empty").mkdir()
  with pytest.raises(CheckpointError, match="no complete checkpoint"):
    checkpoint.restore_model(tmp_path / "empty")
  checkpoint.save_model(tmp_path / "one", create_model(CFG, seed=0), step=0)
  with pytest.raises(CheckpointError, match="has no step 5"):
    checkpoint.restore_model(tmp_path / "one", step=5)


_PRUNING_WRITER = """
import sys, numpy as np, orbax.checkpoint as ocp
mngr = ocp.CheckpointManager(sys.argv[1], options=ocp.CheckpointManagerOptions(max_to_keep=1))
for step in range(100000):
  mngr.save(step, args=ocp.args.Composite(params=ocp.args.StandardSave({"a": np.ones(3)})))
  mngr.wait_until_finished()
"""


def test_reading_a_folder_a_live_run_keeps_pruning(tmp_path):
  """A reader (eval, a test watching a job) lists the steps while the writer deletes the
  older one: orbax lists, then stats each step, and a step gone in between raised (the CI
  failure of test_storage_runs on gs://). Reopening sees the folder as it is now."""
  import subprocess
  import sys
  import time

  writer = subprocess.Popen([sys.executable, "-c", _PRUNING_WRITER, str(tmp_path)],
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
  try:
    deadline, seen = time.time() + 120, []
    while time.time() < deadline and len(seen) < 400:
      steps = checkpoint.saved_steps(tmp_path)
      if steps:
        seen.append(steps[-1])
    assert writer.poll() is None, "the writer stopped early"
  finally:
    writer.kill()
    writer.wait()
  assert len(seen) == 400 and seen == sorted(seen) and seen[-1] > seen[0] + 20, seen[::40]
