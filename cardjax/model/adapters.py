"""LoRA adapters on a whole model: attach fresh ones to a loaded base, merge them back.

`attach` never builds a second copy of the base: the adapted model's base parameters are
the loaded model's own arrays, and only the adapters are initialised (one jit whose other
outputs XLA drops). `merge` folds (alpha / r) A B into each adapted weight and returns a
plain Decoder, which is what export-hf writes and what generate, eval and serve decode.
"""

from __future__ import annotations

import jax
from flax import nnx

from cardjax.model.create import abstract_model
from cardjax.model.decoder import Decoder
from cardjax.model.lora import merged_state
from cardjax.model.lora_spec import LoraSpec
from cardjax.parallel.sharding import param_shardings


def split(model: Decoder):
  """(graphdef, adapters, base) of an adapted model, as pure dicts."""
  graphdef, adapters, base = nnx.split(model, nnx.LoRAParam, nnx.Param)
  return graphdef, nnx.to_pure_dict(adapters), nnx.to_pure_dict(base)


def init_adapters(cfg, spec: LoraSpec, seed: int = 0, mesh=None) -> dict:
  """Fresh adapters (A random, B zero) for cfg's model as a pure dict, in their shardings
  on `mesh`."""
  def make():
    return nnx.to_pure_dict(nnx.split(Decoder(cfg, rngs=nnx.Rngs(seed), lora=spec),
                                      nnx.LoRAParam, nnx.Param)[1])

  if mesh is None:
    return jax.jit(make)()
  with jax.set_mesh(mesh):
    return jax.jit(make, out_shardings=_shardings(cfg, spec, mesh))()


def place(cfg, spec: LoraSpec, values: dict, mesh=None) -> dict:
  """Host (numpy) adapters, e.g. read from a PEFT folder, as arrays in the shardings fresh
  ones get on `mesh`; every host passes the whole value and keeps only its shards."""
  if mesh is None:
    return jax.tree.map(jax.numpy.asarray, values)
  return jax.tree.map(lambda x, s: jax.make_array_from_callback(x.shape, s, lambda i: x[i]),
                      values, _shardings(cfg, spec, mesh))


def _shardings(cfg, spec: LoraSpec, mesh) -> dict:
  """The adapters' shardings on `mesh`, as a pure dict."""
  abstract = nnx.split(abstract_model(cfg, lora=spec), nnx.LoRAParam, nnx.Param)[1]
  return nnx.to_pure_dict(param_shardings(abstract, mesh))


def attach(model: Decoder, spec: LoraSpec, seed: int = 0, mesh=None,
           adapters: dict | None = None) -> Decoder:
  """`model` (a plain Decoder) with `spec`'s adapters: fresh ones, or `adapters` (a pure
  dict, e.g. restored from a checkpoint). The base arrays are shared, not copied."""
  if model.lora is not None:
    raise ValueError("this model already carries LoRA adapters; merge them first")
  base = nnx.to_pure_dict(nnx.state(model, nnx.Param))
  if adapters is None:
    adapters = init_adapters(model.cfg, spec, seed, mesh)
  graphdef, abstract_adapters, abstract_base = nnx.split(
      abstract_model(model.cfg, lora=spec), nnx.LoRAParam, nnx.Param)
  nnx.replace_by_pure_dict(abstract_adapters, adapters)
  nnx.replace_by_pure_dict(abstract_base, base)
  return nnx.merge(graphdef, abstract_adapters, abstract_base)


def merge(model: Decoder) -> Decoder:
  """A plain Decoder whose weights are the adapted model's W + (alpha / r) A B."""
  if model.lora is None:
    return model
  _, adapters, base = split(model)
  graphdef, state = nnx.split(abstract_model(model.cfg))
  nnx.replace_by_pure_dict(state, merged_state(base, adapters, model.lora))
  return nnx.merge(graphdef, state)
