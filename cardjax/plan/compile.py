"""Compile the trainer's own train step for a set of devices, with no weights allocated.

The same pieces `cardjax train` wires (cardjax/train/loop.py): the model's parameter
shardings (abstract_model), the optimizer and its state shardings (state_shardings), and
`jit_train_step`; only the arrays are ShapeDtypeStructs. So the devices may be compile-only
(libtpu's) and the model may be far larger than this machine's memory.
"""

from __future__ import annotations

import contextlib
import dataclasses
import math

import jax
import jax.numpy as jnp
import numpy as np
from flax import nnx

from cardjax.config import model_config
from cardjax.data.pipeline import KEYS as BATCH_KEYS, batch_sharding
from cardjax.model import abstract_model
from cardjax.model.lora_spec import spec_from_config
from cardjax.objectives import make_objective
from cardjax.parallel import make_mesh, use_rules
from cardjax.train import flops
from cardjax.train.optimizer import make_optimizer, state_shardings
from cardjax.train.step import jit_train_step


@dataclasses.dataclass
class Compiled:
  """Per-device bytes of one compiled train step (and what fed them)."""

  params: int  # this device's shard of the parameters (trained and frozen)
  opt_state: int  # ... of the optimizer state
  temp: int  # the compiler's temporaries: activations, gradients, workspace
  total: int  # arguments + outputs - aliased + temporaries
  flops_per_step: float  # model FLOPs of one step, all devices (cardjax.train.flops)
  mesh: dict


def _per_device(tree) -> int:
  """Bytes of one device's shard of every ShapeDtypeStruct in the tree (the largest shard)."""
  total = 0
  for leaf in jax.tree.leaves(tree):
    shard = leaf.sharding.shard_shape(leaf.shape)
    total += math.prod(shard) * jnp.dtype(leaf.dtype).itemsize
  return total


def step_flops(config, cfg, objective) -> float:
  """Model FLOPs per step, attention counted for the objective's mask on one full row
  (eager, on the host: outside any compile-only mesh)."""
  seq = config.data.seq_len
  row = {"tokens": np.full((1, seq), 5, np.int32), "positions": np.arange(seq)[None],
         "segment_ids": np.ones((1, seq), np.int32), "loss_mask": np.ones((1, seq), np.int32)}
  return flops.train_flops_per_step(cfg, objective, row, config.data.batch_size,
                                    frozen_base=config.train.lora.rank > 0)


def compile_step(config, devices) -> Compiled:
  """Lower and compile the train step of `config` for `devices` (may raise the compiler's
  out-of-memory error)."""
  mesh = make_mesh(config.mesh.data, config.mesh.fsdp, config.mesh.tensor, devices=devices,
                   slices=config.mesh.slices)
  rules = config.mesh.rules or None
  with use_rules(rules) if rules else contextlib.nullcontext():
    cfg = model_config(config)
    objective = make_objective(config.objective, cfg)
    # Under LoRA the optimizer holds the adapters; the base is frozen (and may be stored
    # in train.lora.base_dtype), as `cardjax train` splits it.
    spec = spec_from_config(config.train.lora)
    graphdef, params, frozen = nnx.split(abstract_model(cfg, mesh, lora=spec),
                                         nnx.LoRAParam if spec else nnx.Param, nnx.Param)
    params, frozen = nnx.to_pure_dict(params), nnx.to_pure_dict(frozen)
    if spec is not None and config.train.lora.base_dtype:
      dtype = jnp.dtype(config.train.lora.base_dtype)
      frozen = jax.tree.map(lambda a: jax.ShapeDtypeStruct(a.shape, dtype, sharding=a.sharding),
                            frozen)
    tx = make_optimizer(config.train, params)
    # Outside jax.set_mesh: state_shardings runs tx.init on placeholders eagerly, which a
    # compile-only device cannot do; the default (CPU) device does it.
    opt_sh = state_shardings(tx, params, mesh)
  opt_state = jax.tree.map(lambda a, s: jax.ShapeDtypeStruct(a.shape, a.dtype, sharding=s),
                           jax.eval_shape(tx.init, params), opt_sh)
  param_sh = jax.tree.map(lambda x: x.sharding, params)
  rows_sh = batch_sharding(mesh)
  with jax.set_mesh(mesh), (use_rules(rules) if rules else contextlib.nullcontext()):
    step = jit_train_step(graphdef, objective, tx, config.train, config.seed, param_sh, opt_sh,
                          rows_sh, jax.tree.map(lambda x: x.sharding, frozen))
    shape = (config.data.batch_size, config.data.seq_len)
    batch = {k: jax.ShapeDtypeStruct(shape, jnp.int32, sharding=rows_sh)
             for k in BATCH_KEYS}
    compiled = step.lower(params, opt_state, batch, jax.ShapeDtypeStruct((), jnp.int32),
                          frozen).compile()
    mem = compiled.memory_analysis()
  total = (mem.argument_size_in_bytes + mem.output_size_in_bytes - mem.alias_size_in_bytes
           + mem.temp_size_in_bytes)
  return Compiled(params=_per_device(params) + _per_device(frozen),
                  opt_state=_per_device(opt_state),
                  temp=mem.temp_size_in_bytes, total=total,
                  flops_per_step=step_flops(config, cfg, objective), mesh=dict(mesh.shape))
