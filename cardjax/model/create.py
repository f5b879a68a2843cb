"""Create a Decoder: abstractly (shapes only), on one device, or straight into a mesh."""

from __future__ import annotations

import jax
from flax import nnx

from cardjax.model.config import ModelConfig
from cardjax.model.decoder import Decoder
from cardjax.model.lora_spec import LoraSpec
from cardjax.parallel.sharding import param_shardings


def abstract_model(cfg: ModelConfig, mesh=None, lora: LoraSpec | None = None) -> Decoder:
  """A Decoder whose parameters are ShapeDtypeStructs: no memory, no compute. With a mesh,
  each carries the sharding create_model gives it there, so a restore into it allocates
  only the arrays it reads. With `lora`, it carries those adapters too."""
  model = nnx.eval_shape(lambda: Decoder(cfg, rngs=nnx.Rngs(0), lora=lora))
  if mesh is None:
    return model
  graphdef, state = nnx.split(model)
  state = jax.tree.map(lambda v, s: jax.ShapeDtypeStruct(v.shape, v.dtype, sharding=s), state,
                       param_shardings(state, mesh))
  return nnx.merge(graphdef, state)


def create_model(cfg: ModelConfig, seed: int = 0, mesh=None) -> Decoder:
  """Random-init a Decoder. With a mesh, each parameter is created in its own sharding
  (one jit with out_shardings), so no host ever holds the whole model."""
  if mesh is None:
    return Decoder(cfg, rngs=nnx.Rngs(seed))
  graphdef, abstract_state = nnx.split(abstract_model(cfg))
  shardings = param_shardings(abstract_state, mesh)

  init = jax.jit(lambda: nnx.split(Decoder(cfg, rngs=nnx.Rngs(seed)))[1],
                 out_shardings=shardings)
  with jax.set_mesh(mesh):
    state = init()
  return nnx.merge(graphdef, state)


def param_count(model: Decoder) -> int:
  return sum(x.size for x in jax.tree.leaves(nnx.state(model, nnx.Param)))


def cast_params(model: Decoder, dtype: str) -> Decoder:
  """`model` with every parameter stored in `dtype`; its layers compute in cfg.dtype
  whatever the storage, and cfg itself is left as it is (LoRA adapters attached later
  take cfg.param_dtype, not the base's storage)."""
  import jax.numpy as jnp

  graphdef, params, rest = nnx.split(model, nnx.Param, ...)
  params = jax.tree.map(lambda x: x.astype(jnp.dtype(dtype)), params)
  return nnx.merge(graphdef, params, rest)
