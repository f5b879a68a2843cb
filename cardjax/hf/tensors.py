"""Reading a model's parameters from HF-named tensors: `load_tensors` over any reader that
maps HF names to arrays (a safetensors folder, a GGUF file), and the name of each cardjax
parameter in HF's layout."""

from __future__ import annotations

import logging

import jax
import jax.numpy as jnp
import numpy as np
from flax import nnx

from cardjax.errors import CheckpointError
from cardjax.hf.weights import IGNORED_HF_KEYS, from_hf, hf_name, hf_shape
from cardjax.model.config import ModelConfig
from cardjax.model.create import abstract_model
from cardjax.model.decoder import Decoder
from cardjax.parallel.sharding import param_shardings

log = logging.getLogger("cardjax.hf")


def _key_name(key) -> str:
  for attr in ("key", "idx", "name"):
    if hasattr(key, attr):
      return str(getattr(key, attr))
  return str(key)


def param_path(path) -> str:
  return ".".join(_key_name(k) for k in path)


def hf_names(path: str, cfg: ModelConfig) -> list[tuple[str, str]]:
  """[(HF name, layout)] for one cardjax parameter; a stacked layer param has one per layer."""
  if cfg.scan_layers and path.startswith("layers."):
    rest = path[len("layers."):]
    return [hf_name(f"layers.{i}.{rest}") for i in range(cfg.num_layers)]
  return [hf_name(path)]



def load_tensors(cfg: ModelConfig, reader, source: str, mesh=None) -> Decoder:
  """A Decoder for `cfg` whose parameters come from `reader`, anything that maps HF tensor
  names to numpy arrays (`name in reader`, `reader.get(name)`, `reader.keys()`,
  `reader.file_of(name)`): a safetensors folder, a GGUF file. Each parameter lands in its
  sharding on `mesh` (or the mesh set with `jax.set_mesh`)."""
  if mesh is None and not jax.sharding.get_abstract_mesh().empty:
    mesh = jax.sharding.get_mesh()  # the mesh set with `jax.set_mesh`
  graphdef, abstract_state = nnx.split(abstract_model(cfg))
  shardings = param_shardings(abstract_state, mesh) if mesh is not None else None
  used: set[str] = set()

  def load(key_path, variable, sharding=None):
    path_str = param_path(key_path)
    shape = tuple(variable.get_value().shape)
    dtype = variable.get_value().dtype
    names = hf_names(path_str, cfg)
    stacked = cfg.scan_layers and path_str.startswith("layers.")
    per_layer = shape[1:] if stacked else shape
    arrays = []
    for name, layout in names:
      if name not in reader:
        raise CheckpointError(f"tensor {name!r} (for {path_str}, HF shape "
                              f"{list(hf_shape(per_layer, layout))}) is missing from {source}")
      try:
        arrays.append(from_hf(reader.get(name), layout, per_layer).astype(dtype))
      except ValueError as e:
        raise CheckpointError(f"tensor {name!r} in {reader.file_of(name)} has the wrong "
                              f"{e} (the model config says so)") from None
      used.add(name)
    array = np.stack(arrays) if stacked else arrays[0]
    if sharding is None:
      return variable.replace(jnp.asarray(array))
    s = sharding.get_value()
    return variable.replace(jax.make_array_from_callback(shape, s, lambda idx: array[idx]))

  is_var = lambda x: isinstance(x, nnx.Variable)
  if shardings is None:
    state = jax.tree_util.tree_map_with_path(load, abstract_state, is_leaf=is_var)
  else:
    state = jax.tree_util.tree_map_with_path(load, abstract_state, shardings, is_leaf=is_var)
  unused = [k for k in reader.keys() if k not in used and not k.endswith(IGNORED_HF_KEYS)
            and not (cfg.tie_word_embeddings and k == "lm_head.weight")]
  if unused:
    log.warning("%d tensors in %s were not used: %s", len(unused), source, unused[:8])
  return nnx.merge(graphdef, state)
