"""The compiled train step and its sharded state: one device equals eight, accumulation equals
one large batch, chunked losses equal plain ones, and the optimizer state shards like the
parameters (the run-level behaviour is tests/test_train.py)."""

import os

import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest
from flax import nnx
from jax.sharding import NamedSharding, PartitionSpec as P

from cardjax.config import model_config
from cardjax.data.pipeline import PipelineSpec, make_dataset
from cardjax.data.tokenizer import train_bpe
from cardjax.model import create_model
from cardjax.objectives import make_objective
from cardjax.parallel import make_mesh
from cardjax.train import train
from cardjax.train.checkpointing import TrainCheckpointer
from cardjax.train.optimizer import make_optimizer, sharded_init
from cardjax.train.step import make_train_step
from train_helpers import prepare_small, small_config as _config


@pytest.fixture(scope="module")
def data_dir(tmp_path_factory):
  return prepare_small(tmp_path_factory.mktemp("data"))


def _batch(rows=8, seq=32, seed=0):
  docs = [" ".join(["alpha beta gamma"] * (3 + i % 5)) + f" {i}" for i in range(64)]
  tok = train_bpe(docs, 300, f"/tmp/cardjax-test-tok-{os.getpid()}")
  spec = PipelineSpec(seq_len=seq, batch_size=rows, seed=seed)
  return next(iter(make_dataset([{"text": d.encode()} for d in docs], tok, spec, 0, 1)))


def _init_state(config, mesh):
  """(objective, graphdef, params, tx, opt_state) of a fresh model on `mesh` (inside it)."""
  cfg = model_config(config)
  model = create_model(cfg, seed=0, mesh=mesh)
  graphdef, params = nnx.split(model, nnx.Param)
  params = nnx.to_pure_dict(params)
  tx = make_optimizer(config.train, params)
  opt_state = sharded_init(tx, params, mesh)(params)
  return make_objective(config.objective, cfg), graphdef, params, tx, opt_state


def _run_step(config, batch, mesh, accum=1, steps=1, loss_chunk=0):
  with jax.set_mesh(mesh):
    objective, graphdef, params, tx, opt_state = _init_state(config, mesh)
    step = jax.jit(make_train_step(graphdef, objective, tx, config.seed, accum, loss_chunk))
    for i in range(steps):
      params, opt_state, metrics = step(params, opt_state, {k: jnp.asarray(v) for k, v in
                                                            batch.items()}, jnp.int32(i))
    return jax.device_get(params), {k: float(v) for k, v in jax.device_get(metrics).items()}


def _assert_close(a, b, atol):
  for x, y in zip(jax.tree.leaves(a), jax.tree.leaves(b)):
    np.testing.assert_allclose(np.asarray(x), np.asarray(y), atol=atol, rtol=0)


def test_step_on_8_devices_equals_1_device(data_dir):
  config = _config(data_dir, "--config.model.vocab_size=512")
  batch = _batch()
  p1, m1 = _run_step(config, batch, make_mesh(1, 1, 1, devices=jax.devices()[:1]), steps=2)
  p8, m8 = _run_step(config, batch, make_mesh(2, 2, 2), steps=2)
  assert abs(m1["loss"] - m8["loss"]) < 1e-5
  _assert_close(p1, p8, 1e-5)


@pytest.mark.parametrize("objective", ["ar", "card", "mars"])
def test_accumulation_equals_one_large_batch(data_dir, objective):
  config = _config(data_dir, f"--config.objective.name={objective}")
  batch = _batch()
  mesh = make_mesh(1, 1, 1, devices=jax.devices()[:1])
  p1, m1 = _run_step(config, batch, mesh, accum=1)
  p4, m4 = _run_step(config, batch, mesh, accum=4)
  assert abs(m1["loss"] - m4["loss"]) < 1e-5
  _assert_close(p1, p4, 1e-6)


@pytest.mark.parametrize("objective", ["ar", "card", "mars", "mdlm", "bd3lm"])
def test_chunked_loss_equals_the_plain_one(data_dir, objective):
  """train.loss_chunk: the LM head and cross-entropy 12 positions at a time (not a divisor
  of 32 or of MARS's 64, so the padded tail is exercised) give the plain loss and update."""
  config = _config(data_dir, f"--config.objective.name={objective}",
                   "--config.objective.block_size=4")
  batch = _batch()
  mesh = make_mesh(1, 1, 1, devices=jax.devices()[:1])
  p0, m0 = _run_step(config, batch, mesh)
  p1, m1 = _run_step(config, batch, mesh, loss_chunk=12)
  assert abs(m0["loss"] - m1["loss"]) < 1e-5 and abs(m0["grad_norm"] - m1["grad_norm"]) < 1e-5
  _assert_close(p0, p1, 1e-6)


def test_stratified_mdlm_is_the_same_step_split_or_sharded(data_dir):
  """objective.t_draw=stratified indexes the strata by global row: 4 micro-batches and an
  8-device mesh draw the t of one large batch on one device."""
  config = _config(data_dir, "--config.objective.name=mdlm",
                   "--config.objective.t_draw=stratified")
  batch = _batch()
  one = make_mesh(1, 1, 1, devices=jax.devices()[:1])
  p1, m1 = _run_step(config, batch, one)
  p4, m4 = _run_step(config, batch, one, accum=4)
  p8, m8 = _run_step(config, batch, make_mesh(2, 2, 2))
  plain = _run_step(_config(data_dir, "--config.objective.name=mdlm"), batch, one)[1]
  assert abs(m1["loss"] - plain["loss"]) > 1e-3  # the draw changed
  assert abs(m1["loss"] - m4["loss"]) < 1e-5 and abs(m1["loss"] - m8["loss"]) < 1e-5
  _assert_close(p1, p4, 1e-6)
  _assert_close(p1, p8, 1e-5)


def test_accumulation_shrinks_the_compiled_temp_memory(data_dir):
  """Every micro-batch runs inside the scan, so only one micro-batch's activations are
  live: accum 2 needs at most 0.6x accum 1's temp memory (about 2x when the first ran
  outside the scan), and accum 4 less again."""
  config = _config(data_dir, "--config.model.vocab_size=512")
  mesh = make_mesh(1, 1, 1, devices=jax.devices()[:1])
  batch = {k: jax.ShapeDtypeStruct((32, 128), jnp.int32)
           for k in ("tokens", "positions", "segment_ids", "loss_mask")}
  temp = {}
  with jax.set_mesh(mesh):
    objective, graphdef, params, tx, opt_state = _init_state(config, mesh)
    for accum in (1, 2, 4):
      step = jax.jit(make_train_step(graphdef, objective, tx, config.seed, accum))
      compiled = step.lower(params, opt_state, batch, jnp.int32(0)).compile()
      temp[accum] = compiled.memory_analysis().temp_size_in_bytes
  assert temp[2] <= 0.6 * temp[1], temp
  assert temp[4] < temp[2], temp


def _shardings(*trees):
  return jax.tree.map(lambda x: x.sharding, trees)


def _assert_moments_shard_like_params(param_sh, opt_sh):
  """Adam's mu and nu leaves carry their parameter's sharding, some of them split over the
  mesh (not replicated), and every other leaf of the state is replicated."""
  moments = [optax.tree_utils.tree_get(opt_sh, name) for name in ("mu", "nu")]
  params = jax.tree_util.tree_leaves_with_path(param_sh)
  for tree in moments:
    assert jax.tree.structure(tree) == jax.tree.structure(param_sh)
    for (path, want), got in zip(params, jax.tree.leaves(tree)):
      assert got.spec == want.spec and got == want, jax.tree_util.keystr(path)
  assert any(not s.is_fully_replicated for s in jax.tree.leaves(moments))
  rest = [(path, s) for path, s in jax.tree_util.tree_leaves_with_path(opt_sh)
          if not {getattr(k, "name", None) for k in path} & {"mu", "nu"}]
  assert rest  # the step counts
  for path, s in rest:
    assert s.is_fully_replicated, jax.tree_util.keystr(path)


def test_adam_moments_shard_like_their_parameters(data_dir, tmp_path, monkeypatch):
  """On a data x fsdp x tensor mesh the optimizer state is sharded like the parameters
  (ZeRO-3), not replicated on every device: after the init, after train steps (what each
  save is handed) and after a resume."""
  run = ["--config.mesh.data=2", "--config.mesh.fsdp=2", "--config.mesh.tensor=2",
         "--config.train.checkpoint_every=2", "--config.train.eval_every=0"]
  real_save, real_restore = TrainCheckpointer.save, TrainCheckpointer.restore
  saved, restored = [], []

  def save(self, step, params, opt_state, *rest):
    saved.append(_shardings(params, opt_state))
    return real_save(self, step, params, opt_state, *rest)

  def restore(self, *args):
    out = real_restore(self, *args)
    restored.append(_shardings(*out))
    return out

  monkeypatch.setattr(TrainCheckpointer, "save", save)
  monkeypatch.setattr(TrainCheckpointer, "restore", restore)
  train(_config(data_dir, *run, "--config.train.steps=2"), tmp_path)
  config = _config(data_dir, *run, "--config.train.steps=4")
  train(config, tmp_path)
  assert (len(saved), len(restored)) == (2, 1)
  mesh = make_mesh(2, 2, 2)
  with jax.set_mesh(mesh):
    params = nnx.split(create_model(model_config(config), mesh=mesh), nnx.Param)[1]
    params = params.to_pure_dict()
    opt_state = sharded_init(make_optimizer(config.train, params), params, mesh)(params)
  for param_sh, opt_sh in [_shardings(params, opt_state), *saved, *restored]:
    _assert_moments_shard_like_params(param_sh, opt_sh)


def test_state_shardings_of_masked_and_partitioned_chains():
  """Per-parameter state inside optax.masked and multi_transform (which store MaskedNode for
  the parameters they skip) is sharded like its parameter too."""
  mesh = make_mesh(2, 2, 2)
  specs = {"w": P("fsdp", "tensor"), "b": P("fsdp")}
  params = {"w": jnp.zeros((4, 4)), "b": jnp.zeros(4)}
  params = {k: jax.device_put(v, NamedSharding(mesh, specs[k])) for k, v in params.items()}
  tx = optax.multi_transform({"adam": optax.adam(1e-3), "sgd": optax.sgd(1e-3, momentum=0.9)},
                             {"w": "adam", "b": "sgd"})
  state = sharded_init(tx, params, mesh)(params)
  inner = state.inner_states
  adam, trace = inner["adam"].inner_state[0], inner["sgd"].inner_state[0].trace
  assert adam.mu["w"].sharding.spec == adam.nu["w"].sharding.spec == specs["w"]
  assert trace["b"].sharding.spec == specs["b"]
  assert isinstance(adam.mu["b"], optax.MaskedNode) and adam.count.sharding.is_fully_replicated
