"""LoRA adapters in Hugging Face PEFT's folder format, out and in.

A PEFT LoRA folder is `adapter_config.json` plus `adapter_model.safetensors` whose tensors
are `base_model.model.model.layers.{i}.{self_attn|mlp}.{q,k,v,o,gate,up,down}_proj.lora_{A,B}
.weight`, A [r, in] and B [out, r] in torch Linear layout, with the update
(lora_alpha / r) B A x. cardjax's adapters (cardjax/model/lora.py) hold A [in, r] and
B [r, out] over the same flattened in/out sizes HF's weights use (cardjax/hf/weights.py
flattens heads in C order, no permutation), so each tensor is a plain transpose, and
cardjax's alpha is PEFT's lora_alpha (alpha 0 is written as r).
"""

from __future__ import annotations

import json
import re
from pathlib import Path

import jax
import jax.numpy as jnp
import numpy as np

from cardjax.errors import CheckpointError, ConfigError
from cardjax.hf.weights import LAYER_PARAMS
from cardjax.model.lora_spec import TARGETS, LoraSpec

CONFIG = "adapter_config.json"
WEIGHTS = "adapter_model.safetensors"
# cardjax target -> (cardjax module of a block, HF module of a decoder layer), read from the
# weight map the HF import and export use: "attn.q" <-> "self_attn.q_proj.weight".
MODULES = {path.split(".")[1]: (path.split(".")[0], hf.removesuffix(".weight"))
           for path, hf, _ in LAYER_PARAMS if path.split(".")[-1] in TARGETS}
_BY_HF = {hf.split(".")[1]: target for target, (_, hf) in MODULES.items()}  # q_proj -> q
_KEY = re.compile(r"^base_model\.model\.model\.layers\.(\d+)\.(?:self_attn|mlp)\.(\w+)"
                  r"\.lora_([AB])\.weight$")


def hf_module(target: str) -> str:
  """q -> q_proj: PEFT's target_modules name of a cardjax target."""
  return MODULES[target][1].split(".")[1]


def _key(layer: int, target: str, which: str) -> str:
  return f"base_model.model.model.layers.{layer}.{MODULES[target][1]}.lora_{which}.weight"


def _lora(adapters: dict, cfg, layer: int, target: str) -> dict:
  """The {lora_a, lora_b} of one projection in a pure-dict adapter tree: layer `layer`'s,
  or every layer's stacked [layers, ...] when the model scans its layers."""
  layers = adapters["layers"]
  return (layers if cfg.scan_layers else layers[layer])[MODULES[target][0]][
      f"{target}_lora"]["lora"]


def _site(adapters: dict, cfg, layer: int, target: str) -> tuple:
  """(A [in, r], B [r, out]) of one projection of one layer."""
  lora = _lora(adapters, cfg, layer, target)
  a, b = lora["lora_a"], lora["lora_b"]
  return (a[layer], b[layer]) if cfg.scan_layers else (a, b)


def _shapes(cfg, spec: LoraSpec) -> dict[str, tuple[tuple, tuple]]:
  """target -> (A's shape, B's shape) of one layer, as the model itself builds them."""
  from flax import nnx

  from cardjax.model.create import abstract_model

  abstract = nnx.to_pure_dict(nnx.split(abstract_model(cfg, lora=spec), nnx.LoRAParam,
                                        nnx.Param)[1])
  skip = 1 if cfg.scan_layers else 0  # the stacked layers axis
  return {t: tuple(tuple(_lora(abstract, cfg, 0, t)[k].shape[skip:])
                   for k in ("lora_a", "lora_b")) for t in spec.targets}


def peft_tensors(adapters: dict, cfg, spec: LoraSpec, gather=np.asarray):
  """Yield (PEFT name, numpy array) for every adapter; `gather` makes an array host numpy
  (a multi-host gather where the adapters are sharded over hosts)."""
  for layer in range(cfg.num_layers):
    for target in spec.targets:
      a, b = _site(adapters, cfg, layer, target)
      yield _key(layer, target, "A"), np.ascontiguousarray(gather(a).T)
      yield _key(layer, target, "B"), np.ascontiguousarray(gather(b).T)


def adapter_config(spec: LoraSpec, base: str | None) -> dict:
  """adapter_config.json as peft's LoraConfig writes it (its other fields at their
  defaults, which peft fills in when they are absent)."""
  return {"peft_type": "LORA", "task_type": "CAUSAL_LM", "base_model_name_or_path": base,
          "revision": None, "r": spec.rank, "lora_alpha": spec.alpha or spec.rank,
          "lora_dropout": spec.dropout, "target_modules": [hf_module(t) for t in spec.targets],
          "bias": "none", "fan_in_fan_out": False, "inference_mode": True,
          "init_lora_weights": True, "use_rslora": False, "use_dora": False,
          "modules_to_save": None, "layers_to_transform": None, "layers_pattern": None,
          "rank_pattern": {}, "alpha_pattern": {}, "exclude_modules": None}


def write_adapter(path: str | Path, adapters: dict, cfg, spec: LoraSpec, base: str | None,
                  dtype: str | None = None, gather=np.asarray) -> Path:
  """Write a PEFT adapter folder at local `path`; `base` is its base_model_name_or_path."""
  from safetensors.numpy import save_file
  path = Path(path)
  path.mkdir(parents=True, exist_ok=True)
  tensors = {k: v.astype(jnp.dtype(dtype)) if dtype else v
             for k, v in peft_tensors(adapters, cfg, spec, gather)}
  # Under a temporary name first, so an interrupted export never looks complete.
  save_file(tensors, str(path / (WEIGHTS + ".tmp")), metadata={"format": "pt"})
  (path / (WEIGHTS + ".tmp")).replace(path / WEIGHTS)
  (path / CONFIG).write_text(json.dumps(adapter_config(spec, base), indent=2, sort_keys=True)
                             + "\n")
  return path


def read_config(path: str | Path) -> dict:
  """adapter_config.json of a PEFT LoRA folder that cardjax can read, or one clear error
  naming what it has that cardjax does not support."""
  path = Path(path)
  if not (path / CONFIG).is_file() or not (path / WEIGHTS).is_file():
    found = sorted(p.name for p in path.iterdir()) if path.is_dir() else "no such folder"
    raise CheckpointError(f"{path} is not a PEFT adapter folder: it needs {CONFIG} and "
                          f"{WEIGHTS} (found {found})")
  config = json.loads((path / CONFIG).read_text())
  unsupported = {"peft_type": ("LORA",), "bias": ("none",), "use_dora": (False,),
                 "use_rslora": (False,), "fan_in_fan_out": (False,),
                 "modules_to_save": (None, []), "rank_pattern": ({}, None),
                 "alpha_pattern": ({}, None), "layer_replication": (None,)}
  bad = [f"{k}={config[k]!r}" for k, ok in unsupported.items()
         if k in config and config[k] not in ok]
  if bad:
    raise CheckpointError(f"{path / CONFIG}: cardjax reads plain LoRA adapters on the "
                          f"q/k/v/o/gate/up/down projections; this one has {', '.join(bad)}")
  return config


def _describe(rank, alpha, targets) -> str:
  return f"rank {rank}, alpha {alpha:g}, targets {','.join(targets)}"


def read_adapter(path: str | Path, cfg, spec: LoraSpec) -> dict:
  """The PEFT adapter folder at `path` as cardjax adapters (a pure dict of numpy arrays in
  cfg.param_dtype, stacked when cfg scans its layers) for a model `cfg` with `spec`.

  The adapter's rank, alpha and targets must be the config's (train.lora): one ConfigError
  names both sides and the flags that fit the adapter. Its layers and sizes must be the
  base's (train.init_from): one CheckpointError names both."""
  path = Path(path)
  config = read_config(path)
  reader = _AdapterReader(path)
  found: dict[tuple[int, str, str], str] = {}
  for name in reader.keys():
    match = _KEY.match(name)
    if match is None or match.group(2) not in _BY_HF:
      raise CheckpointError(f"{path / WEIGHTS}: tensor {name!r} is not a LoRA A or B of a "
                            f"decoder layer's {', '.join(hf_module(t) for t in TARGETS)}")
    found[(int(match.group(1)), _BY_HF[match.group(2)], match.group(3))] = name
  targets = tuple(t for t in TARGETS if any(k[1] == t for k in found))
  ranks = {reader.get(n).shape[0] for (_, _, w), n in found.items() if w == "A"}
  if len(ranks) != 1:
    raise CheckpointError(f"{path / WEIGHTS}: lora_A tensors of ranks {sorted(ranks)}; "
                          "cardjax reads one rank for every projection")
  rank = ranks.pop()
  alpha = float(config.get("lora_alpha", 8))  # peft's default when absent
  want_alpha = float(spec.alpha or spec.rank)
  if (rank, alpha, targets) != (spec.rank, want_alpha, spec.targets):
    raise ConfigError(
        f"train.lora.init_from={str(path)!r} holds a LoRA adapter of "
        f"{_describe(rank, alpha, targets)} (PEFT r={rank}, lora_alpha={alpha:g}, "
        f"target_modules {[hf_module(t) for t in targets]}), but the config's train.lora is "
        f"{_describe(spec.rank, want_alpha, spec.targets)}; set --config.train.lora.rank={rank}"
        f" --config.train.lora.alpha={alpha:g} --config.train.lora.targets="
        f"{','.join(targets)} to continue this adapter, or leave train.lora.init_from empty "
        "to start fresh adapters")
  return _arrays(path, reader, found, cfg, spec)


def _arrays(path: Path, reader, found: dict, cfg, spec: LoraSpec) -> dict:
  """The checked tensors of an adapter that matches `spec`, in cardjax's tree and layout."""
  shapes = _shapes(cfg, spec)
  layers = sorted({k[0] for k in found})
  if layers and layers[-1] >= cfg.num_layers:
    raise CheckpointError(f"{path / WEIGHTS} adapts layers up to {layers[-1]}, but the base "
                          f"model (train.init_from) has {cfg.num_layers} layers: pass the "
                          "base model the adapter was trained on")
  if len(found) != 2 * cfg.num_layers * len(spec.targets):
    raise CheckpointError(f"{path / WEIGHTS} adapts {','.join(spec.targets)} on layers "
                          f"{layers} only (or lacks some lora_A / lora_B), of the base's "
                          f"{cfg.num_layers}: cardjax adapts every layer (peft's "
                          "layers_to_transform is not read)")
  dtype = jnp.dtype(cfg.param_dtype)
  per_layer = []
  for layer in range(cfg.num_layers):
    tree: dict = {}
    for target in spec.targets:
      a, b = reader.get(found[(layer, target, "A")]), reader.get(found[(layer, target, "B")])
      (n_in, _), (_, n_out) = shapes[target]
      if a.shape != (spec.rank, n_in) or b.shape != (n_out, spec.rank):
        raise CheckpointError(
            f"{path / WEIGHTS}: {hf_module(target)} of layer {layer} has lora_A "
            f"{list(a.shape)} and lora_B {list(b.shape)}, but the base model "
            f"(train.init_from) needs [{spec.rank}, {n_in}] and [{n_out}, {spec.rank}] "
            f"(its {hf_module(target)} is [{n_out}, {n_in}]): pass the base model the "
            "adapter was trained on")
      group = tree.setdefault(MODULES[target][0], {})
      group[f"{target}_lora"] = {"lora": {"lora_a": np.ascontiguousarray(a.T, dtype),
                                          "lora_b": np.ascontiguousarray(b.T, dtype)}}
    per_layer.append(tree)
  if not cfg.scan_layers:
    return {"layers": dict(enumerate(per_layer))}
  return {"layers": jax.tree.map(lambda *xs: np.stack(xs), *per_layer)}


class _AdapterReader:
  """Tensors by name from adapter_model.safetensors (peft writes one file, never shards)."""

  def __init__(self, path: Path):
    from safetensors import safe_open
    try:
      self._handle = safe_open(str(path / WEIGHTS), framework="numpy")
    except Exception as e:  # safetensors raises its own error types for bad headers
      raise CheckpointError(f"{path / WEIGHTS} is not a readable safetensors file: {e}") \
          from None

  def keys(self) -> list[str]:
    return list(self._handle.keys())

  def get(self, name: str) -> np.ndarray:
    return self._handle.get_tensor(name)
