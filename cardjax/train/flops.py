"""Model FLOPs per step and MFU, with attention counted for the mask actually used.

Matmul FLOPs: 6 per parameter per token (forward + backward) for every weight matrix that
multiplies activations (the LM head included, the embedding lookup not). Attention: 4 *
head_dim * heads FLOPs per visible (query, key) pair and layer in the forward pass, x3 for
training; the visible pairs are counted from the batch's real mask (MARS's dual stream
sees far less than (2L)^2, packed rows less than a causal L^2 / 2). Rematerialisation is
not counted (the usual MFU convention).
"""

from __future__ import annotations

import jax
import numpy as np

from cardjax.attention import dense_mask
from cardjax.model.config import ModelConfig

# Dense bf16 peak per device (no sparsity), matched against jax's device_kind, lower-cased,
# first match wins: so the longer names come first ("h100 pcie" before "h100", "l40s" before
# "l4", "a100" before "a10", "v5 lite" before "v5"). TPU v5p chips report "TPU v5" and v5e
# "TPU v5 lite"; v6e "TPU v6 lite"; a TPU device is a chip (megacore on v4/v5p).
PEAK_FLOPS = (
    ("gh200", 989e12), ("h200", 989e12), ("h100 pcie", 756e12), ("h100", 989e12),
    ("h800", 989e12), ("b200", 2250e12), ("b100", 1750e12), ("a100", 312e12),
    ("a800", 312e12), ("l40s", 362e12), ("a10", 125e12), ("l4", 121e12), ("v100", 125e12),
    ("tpu v6 lite", 918e12), ("tpu v6e", 918e12), ("tpu v5 lite", 197e12),
    ("tpu v5e", 197e12), ("tpu v5p", 459e12), ("tpu v5", 459e12), ("tpu v4", 275e12),
    ("tpu v3", 123e12), ("tpu v2", 45e12))


def peak_flops_per_device(device=None) -> float | None:
  return peak_flops_for_kind((device or jax.devices()[0]).device_kind)


def peak_flops_for_kind(kind: str) -> float | None:
  """The PEAK_FLOPS entry for a device_kind; None for CPUs and unknown chips (no MFU)."""
  kind = kind.lower()
  for key, value in PEAK_FLOPS:
    if key in kind:
      return value
  return None


def matmul_params(cfg: ModelConfig) -> int:
  d, f, hd = cfg.hidden_size, cfg.intermediate_size, cfg.resolved_head_dim
  per_layer = d * hd * (cfg.num_heads * 2 + cfg.num_kv_heads * 2) + 3 * d * f
  return cfg.num_layers * per_layer + cfg.vocab_size * d


def visible_pairs(inputs) -> float:
  """Visible (query, key) pairs per row, averaged over the batch, from a ModelInputs."""
  meta = tuple(np.asarray(a) for a in (inputs.positions, inputs.streams, inputs.segment_ids))
  mask = dense_mask(inputs.mask, meta, meta)
  real = (meta[2] > 0)[:, :, None] & (meta[2] > 0)[:, None, :]
  return float((mask & real).sum() / mask.shape[0])


def train_flops_per_row(cfg: ModelConfig, model_tokens: int, pairs: float) -> float:
  """Training FLOPs for one row of `model_tokens` tokens with `pairs` visible pairs."""
  dense = 6.0 * matmul_params(cfg) * model_tokens
  attention = 3.0 * 4.0 * cfg.resolved_head_dim * cfg.num_heads * cfg.num_layers * pairs
  return dense + attention
