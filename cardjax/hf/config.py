"""Hugging Face config.json <-> ModelConfig for the qwen2, qwen3 and llama model types.

Reads both config layouts in the wild: transformers 4 (`rope_theta`, `rope_scaling`) and
transformers 5 (`rope_parameters`). Writes both, so either version loads the export.
"""

from __future__ import annotations

import json
import logging
from pathlib import Path
from typing import Any

from cardjax.errors import CheckpointError
from cardjax.model.config import ModelConfig

log = logging.getLogger("cardjax.hf")

ARCHITECTURES = {"qwen2": "Qwen2ForCausalLM", "llama": "LlamaForCausalLM",
                 "qwen3": "Qwen3ForCausalLM"}
# Model types that are another's weights and config keys under a new name: released MARS
# checkpoints (Xalp/MARS) save a Qwen2 model as "a2d-qwen2", whose class only swaps the
# causal mask (cardjax builds its own masks). Exports say "qwen2", which transformers loads
# without remote code.
ALIASES = {"a2d-qwen2": "qwen2"}


def read_config_json(directory: str | Path) -> dict[str, Any]:
  path = Path(directory) / "config.json"
  if not Path(directory).is_dir():
    raise CheckpointError(f"{directory} is not a directory; pass a Hugging Face model folder "
                          "(config.json + *.safetensors)")
  if not path.is_file():
    raise CheckpointError(f"{path} is missing; a Hugging Face model folder needs config.json")
  try:
    values = json.loads(path.read_text())
  except json.JSONDecodeError as e:
    raise CheckpointError(f"{path} is not valid JSON: {e}") from None
  if not isinstance(values, dict):
    raise CheckpointError(f"{path} must hold a JSON object, got {type(values).__name__}")
  return values


def _first_id(value) -> int:
  if value is None:
    return -1
  if isinstance(value, (list, tuple)):
    return int(value[0]) if value else -1
  return int(value)


def model_config_from_hf(hf: dict[str, Any], source: str = "config.json",
                         **overrides) -> ModelConfig:
  """The ModelConfig for a HF config dict; `overrides` set the non-HF fields (dtype, ...)."""
  model_type = hf.get("model_type")
  if model_type in ALIASES:
    log.info("%s: model_type %r is read as %r (the same weights and config keys)", source,
             model_type, ALIASES[model_type])
    model_type = ALIASES[model_type]
  if model_type not in ARCHITECTURES:
    raise CheckpointError(f"{source}: unsupported model_type {model_type!r}; cardjax reads "
                          f"{sorted(ARCHITECTURES)} (Qwen2/Qwen2.5, Qwen3 and Llama families)")

  def need(key):
    if key not in hf:
      raise CheckpointError(f"{source}: required key {key!r} is missing")
    return _int(key, hf[key])

  def _int(key, value):
    if isinstance(value, bool) or not isinstance(value, (int, float)) or int(value) != value:
      raise CheckpointError(f"{source}: {key}={value!r} must be an integer")
    return int(value)

  def _num(key, default):
    value = hf.get(key, default)
    if isinstance(value, bool) or not isinstance(value, (int, float)):
      raise CheckpointError(f"{source}: {key}={value!r} must be a number")
    return float(value)

  if hf.get("hidden_act", "silu") != "silu":
    raise CheckpointError(f"{source}: hidden_act={hf['hidden_act']!r}; only 'silu' (SwiGLU) "
                          "is implemented")
  if hf.get("use_sliding_window", False):
    raise CheckpointError(f"{source}: use_sliding_window=true is not implemented; set it "
                          "to false (Qwen2.5 and Qwen3 releases ship with it off)")

  rope, legacy = hf.get("rope_parameters") or {}, hf.get("rope_scaling") or {}
  for key, value in (("rope_parameters", rope), ("rope_scaling", legacy)):
    if not isinstance(value, dict):
      raise CheckpointError(f"{source}: {key}={value!r} must be an object")
  rope = {**legacy, **rope}
  rope_type = rope.get("rope_type", rope.get("type", "default"))
  if rope_type not in ("default", "linear", "llama3"):
    raise CheckpointError(f"{source}: rope type {rope_type!r} is not implemented; "
                          "cardjax has default, linear and llama3")
  theta = rope.get("rope_theta", hf.get("rope_theta", 10000.0))

  heads = need("num_attention_heads")
  # transformers' Qwen3Config defaults head_dim to 128 (not hidden / heads) when it is absent.
  default_head_dim = 128 if model_type == "qwen3" else 0
  if isinstance(theta, bool) or not isinstance(theta, (int, float)):
    raise CheckpointError(f"{source}: rope_theta={theta!r} must be a number")
  try:
    values = dict(
        model_type=model_type,
        vocab_size=need("vocab_size"),
        hidden_size=need("hidden_size"),
        intermediate_size=need("intermediate_size"),
        num_layers=need("num_hidden_layers"),
        num_heads=heads,
        num_kv_heads=_int("num_key_value_heads", hf.get("num_key_value_heads") or heads),
        head_dim=_int("head_dim", hf.get("head_dim") or default_head_dim),
        rms_norm_eps=_num("rms_norm_eps", 1e-6),
        rope_theta=float(theta),
        rope_type=rope_type,
        rope_factor=float(rope.get("factor", 1.0)),
        rope_low_freq_factor=float(rope.get("low_freq_factor", 1.0)),
        rope_high_freq_factor=float(rope.get("high_freq_factor", 4.0)),
        rope_original_max_position=int(rope.get("original_max_position_embeddings", 8192)),
        max_position_embeddings=_int("max_position_embeddings",
                                     hf.get("max_position_embeddings", 2048)),
        tie_word_embeddings=bool(hf.get("tie_word_embeddings", False)),
        bos_token_id=_first_id(hf.get("bos_token_id")),
        eos_token_id=_first_id(hf.get("eos_token_id")),
        pad_token_id=_first_id(hf.get("pad_token_id")),
        initializer_range=_num("initializer_range", 0.02),
    )
  except (TypeError, ValueError) as e:  # a rope field or token id of the wrong type
    raise CheckpointError(f"{source}: a rope or token-id value is malformed ({e})") from None
  if model_type == "qwen2":
    values.update(qkv_bias=True, o_bias=False, mlp_bias=False)
  elif model_type == "qwen3":  # attention_bias covers q, k, v and o; the MLP has none
    bias = bool(hf.get("attention_bias", False))
    values.update(qkv_bias=bias, o_bias=bias, mlp_bias=False, qk_norm=True)
  else:
    bias = bool(hf.get("attention_bias", False))
    values.update(qkv_bias=bias, o_bias=bias, mlp_bias=bool(hf.get("mlp_bias", False)))
  if "mask_token_id" in hf:
    values["mask_token_id"] = int(hf["mask_token_id"])
  values.update(overrides)
  try:
    return ModelConfig.from_dict(values)
  except ValueError as e:
    raise CheckpointError(f"{source}: {e}") from None


def hf_config_from_model(cfg: ModelConfig, dtype: str) -> dict[str, Any]:
  """config.json content for `cfg`, stored in `dtype`."""
  head_dim = cfg.resolved_head_dim
  if cfg.model_type == "qwen2":
    if not cfg.qkv_bias or cfg.o_bias or cfg.mlp_bias:
      raise CheckpointError("qwen2 has biases on q, k, v only; this model's bias settings "
                            "need model_type=llama")
  elif cfg.qkv_bias != cfg.o_bias:
    raise CheckpointError(f"{cfg.model_type}'s attention_bias covers q, k, v and o together; "
                          f"got qkv_bias={cfg.qkv_bias} o_bias={cfg.o_bias}")
  if cfg.model_type == "qwen3" and cfg.mlp_bias:
    raise CheckpointError("qwen3 has no MLP biases, and llama no q/k norms: a model with "
                          "qk_norm=true and mlp_bias=true has no transformers class")
  if cfg.qk_norm and cfg.model_type != "qwen3":
    raise CheckpointError(f"{cfg.model_type} has no q/k norms; a model with qk_norm=true "
                          "exports as model_type=qwen3")
  rope: dict[str, Any] = {"rope_type": cfg.rope_type, "rope_theta": cfg.rope_theta}
  if cfg.rope_type == "linear":
    rope["factor"] = cfg.rope_factor
  elif cfg.rope_type == "llama3":
    rope.update(factor=cfg.rope_factor, low_freq_factor=cfg.rope_low_freq_factor,
                high_freq_factor=cfg.rope_high_freq_factor,
                original_max_position_embeddings=cfg.rope_original_max_position)
  scaling = None if cfg.rope_type == "default" else {k: v for k, v in rope.items()
                                                     if k != "rope_theta"}
  out: dict[str, Any] = {
      "architectures": [ARCHITECTURES[cfg.model_type]],
      "model_type": cfg.model_type,
      "vocab_size": cfg.vocab_size,
      "hidden_size": cfg.hidden_size,
      "intermediate_size": cfg.intermediate_size,
      "num_hidden_layers": cfg.num_layers,
      "num_attention_heads": cfg.num_heads,
      "num_key_value_heads": cfg.num_kv_heads,
      "hidden_act": "silu",
      "max_position_embeddings": cfg.max_position_embeddings,
      "rms_norm_eps": cfg.rms_norm_eps,
      "rope_theta": cfg.rope_theta,
      "rope_scaling": scaling,
      "rope_parameters": rope,
      "tie_word_embeddings": cfg.tie_word_embeddings,
      "initializer_range": cfg.initializer_range,
      "attention_dropout": 0.0,
      "use_cache": True,
      "torch_dtype": dtype,
      "dtype": dtype,
  }
  if cfg.model_type == "qwen2":
    out.update(use_sliding_window=False, sliding_window=None,
               max_window_layers=cfg.num_layers)
    if head_dim * cfg.num_heads != cfg.hidden_size:
      out["head_dim"] = head_dim  # read by transformers >= 5; older versions assume d / h
  elif cfg.model_type == "qwen3":  # head_dim always: an absent one reads as 128
    out.update(head_dim=head_dim, attention_bias=cfg.qkv_bias, use_sliding_window=False,
               sliding_window=None, max_window_layers=cfg.num_layers)
  else:
    out.update(head_dim=head_dim, attention_bias=cfg.qkv_bias, mlp_bias=cfg.mlp_bias,
               pretraining_tp=1)
  for key in ("bos_token_id", "eos_token_id", "pad_token_id", "mask_token_id"):
    value = getattr(cfg, key)
    if value >= 0:
      out[key] = value
  return out
