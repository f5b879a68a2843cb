"""Hugging Face interop: load a local HF folder into a Decoder, write one back.

`from_pretrained(path)` reads config.json and single or sharded safetensors and places each
tensor straight into its sharding when a mesh is given (or set with `jax.set_mesh`): every
host builds only the shards it owns. `save_pretrained(model, path)` gathers the parameters
(across hosts too), and process 0 writes config.json, safetensors and the tokenizer files
that `transformers.AutoModelForCausalLM.from_pretrained` reads.
"""

from __future__ import annotations

import logging
import shutil
import weakref
from pathlib import Path

import jax
import jax.numpy as jnp
import numpy as np
from flax import nnx

from cardjax.hf.config import hf_config_from_model, model_config_from_hf, read_config_json
from cardjax.hf.safetensors_io import SafetensorsReader, write_safetensors
from cardjax.hf.tensors import hf_names, load_tensors, param_path
from cardjax.hf.weights import to_hf
from cardjax.model.decoder import Decoder
from cardjax.storage import is_remote, resolve
from cardjax.storage.transfer import cached_copy, local_output

log = logging.getLogger("cardjax.hf")

# Files copied alongside the weights so the export is a complete HF model folder.
ASSET_FILES = ("tokenizer.json", "tokenizer_config.json", "vocab.json", "merges.txt",
               "special_tokens_map.json", "added_tokens.json", "tokenizer.model",
               "chat_template.jinja", "chat_template.json", "generation_config.json")

# Where each loaded model came from, so save_pretrained can copy its tokenizer files.
_SOURCES: "weakref.WeakKeyDictionary[Decoder, Path]" = weakref.WeakKeyDictionary()


def asset_files(directory: str | Path) -> list[Path]:
  directory = Path(directory)
  return [directory / name for name in ASSET_FILES if (directory / name).is_file()]


def from_pretrained(path: str | Path, mesh=None, **overrides) -> Decoder:
  """Load a HF folder (local, or gs:// / s3://: downloaded to its staging folder first).
  `overrides` set ModelConfig fields HF does not have (dtype, param_dtype, scan_layers,
  remat, mask_token_id, ...)."""
  path = cached_copy(path)
  cfg = model_config_from_hf(read_config_json(path), source=str(path / "config.json"),
                             **overrides)
  model = load_tensors(cfg, SafetensorsReader(path), str(path), mesh)
  _SOURCES[model] = path
  return model


def _gather(x) -> np.ndarray:
  """A host numpy copy of a (possibly multi-host sharded) array."""
  if isinstance(x, jax.Array) and not x.is_fully_addressable:
    from jax.experimental import multihost_utils
    return np.asarray(multihost_utils.process_allgather(x, tiled=True))
  return np.asarray(jax.device_get(x))


def hf_tensors(model: Decoder, dtype: str | None = None):
  """Yield (HF name, numpy array) for every parameter, in `dtype` (default param_dtype)."""
  cfg = model.cfg
  np_dtype = jnp.dtype(dtype or cfg.param_dtype)
  flat = jax.tree_util.tree_flatten_with_path(
      nnx.state(model, nnx.Param), is_leaf=lambda x: isinstance(x, nnx.Variable))[0]
  for key_path, variable in flat:
    path_str = param_path(key_path)
    array = _gather(variable.get_value()).astype(np_dtype)
    names = hf_names(path_str, cfg)
    if cfg.scan_layers and path_str.startswith("layers."):
      for (name, layout), layer in zip(names, array):
        yield name, to_hf(layer, layout)
    else:
      name, layout = names[0]
      yield name, to_hf(array, layout)


def save_pretrained(model: Decoder, path: str | Path, dtype: str | None = None,
                    assets_from: str | Path | None = None,
                    max_shard_bytes: int = 5 * 2**30) -> Path | str:
  """Write `model` as a HF folder. Every process must call it (the gather is collective);
  only process 0 writes. Tokenizer files come from `assets_from`, else from the folder the
  model was loaded from. A bucket `path` (gs://, s3://) is written locally, then uploaded."""
  if assets_from is not None:  # a bucket folder: read from a local copy
    assets_from = cached_copy(assets_from)
  if is_remote(path):
    with local_output(path) as local:
      _save_local(model, local, dtype, assets_from, max_shard_bytes)
    return resolve(path)
  return _save_local(model, Path(resolve(path)), dtype, assets_from, max_shard_bytes)


def _save_local(model, path, dtype, assets_from, max_shard_bytes) -> Path:
  import json

  cfg = model.cfg
  dtype = dtype or cfg.param_dtype
  config = hf_config_from_model(cfg, dtype)
  tensors = hf_tensors(model, dtype)
  path = Path(path)
  if jax.process_index() != 0:
    for _ in tensors:  # take part in every gather, write nothing
      pass
    return path
  path.mkdir(parents=True, exist_ok=True)
  write_safetensors(path, tensors, max_shard_bytes=max_shard_bytes)
  source = Path(assets_from) if assets_from is not None else _SOURCES.get(model)
  if source is not None:
    for f in asset_files(source):
      if f.resolve() != (path / f.name).resolve():  # exporting into the source folder
        shutil.copyfile(f, path / f.name)
  (path / "config.json").write_text(json.dumps(config, indent=2, sort_keys=True) + "\n")
  return path


__all__ = ["from_pretrained", "from_gguf", "load_tensors", "save_pretrained", "hf_tensors",
           "asset_files", "model_config_from_hf", "hf_config_from_model", "SafetensorsReader"]


def from_gguf(path: str | Path, mesh=None, **overrides) -> Decoder:
  """Load a llama.cpp GGUF file (see cardjax/hf/gguf.py)."""
  from cardjax.hf.gguf import from_gguf as load
  return load(path, mesh=mesh, **overrides)
