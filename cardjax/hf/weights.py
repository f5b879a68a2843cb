"""The map between cardjax parameter paths and Hugging Face tensor names and layouts.

cardjax keeps head structure in the shapes ([embed, heads, head_dim]) where HF keeps torch
Linear layout ([out, in]); each entry says how to turn one into the other.
"""

from __future__ import annotations

import math

import numpy as np

# (cardjax path inside a block, HF name inside "model.layers.{i}.", layout)
LAYER_PARAMS = (
    ("attn_norm.scale", "input_layernorm.weight", "copy"),
    ("attn.q", "self_attn.q_proj.weight", "in"),
    ("attn.k", "self_attn.k_proj.weight", "in"),
    ("attn.v", "self_attn.v_proj.weight", "in"),
    ("attn.o", "self_attn.o_proj.weight", "out"),
    ("attn.q_bias", "self_attn.q_proj.bias", "flat"),
    ("attn.k_bias", "self_attn.k_proj.bias", "flat"),
    ("attn.v_bias", "self_attn.v_proj.bias", "flat"),
    ("attn.out_bias", "self_attn.o_proj.bias", "copy"),
    ("attn.q_norm", "self_attn.q_norm.weight", "copy"),
    ("attn.k_norm", "self_attn.k_norm.weight", "copy"),
    ("mlp_norm.scale", "post_attention_layernorm.weight", "copy"),
    ("mlp.gate", "mlp.gate_proj.weight", "in"),
    ("mlp.up", "mlp.up_proj.weight", "in"),
    ("mlp.down", "mlp.down_proj.weight", "out"),
    ("mlp.gate_bias", "mlp.gate_proj.bias", "copy"),
    ("mlp.up_bias", "mlp.up_proj.bias", "copy"),
    ("mlp.down_bias", "mlp.down_proj.bias", "copy"),
)
TOP_PARAMS = (
    ("embed", "model.embed_tokens.weight", "copy"),
    ("final_norm.scale", "model.norm.weight", "copy"),
    ("lm_head", "lm_head.weight", "copy"),
)
# Present in some HF checkpoints, derived here; never an error to find them.
IGNORED_HF_KEYS = ("rotary_emb.inv_freq",)
_LAYER = {ours: (hf, layout) for ours, hf, layout in LAYER_PARAMS}
_TOP = {ours: (hf, layout) for ours, hf, layout in TOP_PARAMS}


def hf_name(path: str) -> tuple[str, str]:
  """(HF tensor name, layout) for a per-layer path 'layers.{i}.attn.q' or a top path."""
  if path.startswith("layers."):
    _, index, rest = path.split(".", 2)
    hf, layout = _LAYER[rest]
    return f"model.layers.{index}.{hf}", layout
  return _TOP[path]


def to_hf(array: np.ndarray, layout: str) -> np.ndarray:
  if layout == "copy":
    return array
  if layout == "flat":
    return array.reshape(-1)
  if layout == "in":  # [in, *out] -> [out, in]
    return array.reshape(array.shape[0], -1).T
  if layout == "out":  # [*in, out] -> [out, in]
    return array.reshape(-1, array.shape[-1]).T
  raise ValueError(layout)


def hf_shape(shape: tuple[int, ...], layout: str) -> tuple[int, ...]:
  """The HF shape of a cardjax parameter of `shape`."""
  if layout == "copy":
    return tuple(shape)
  if layout == "flat":
    return (math.prod(shape),)
  if layout == "in":
    return (math.prod(shape[1:]), shape[0])
  return (shape[-1], math.prod(shape[:-1]))


def from_hf(array: np.ndarray, layout: str, shape: tuple[int, ...]) -> np.ndarray:
  """The inverse of to_hf; raises ValueError when the HF shape cannot give `shape`."""
  expected = hf_shape(shape, layout)
  if tuple(array.shape) != tuple(expected):
    raise ValueError(f"shape {list(array.shape)}, expected {list(expected)}")
  if layout in ("copy", "flat"):
    return array.reshape(shape)
  return array.T.reshape(shape)
