"""Model FLOPs per step and MFU, with attention counted for the mask actually used.

Matmul FLOPs: 6 per parameter per token (forward + backward) for every weight matrix that
multiplies activations (the LM head included, the embedding lookup not). Attention: 4 *
head_dim * heads FLOPs per visible (query, key) pair and layer in the forward pass, x3 for
training; the visible pairs are counted from the batch's real mask (MARS's dual stream
sees far less than (2L)^2, packed rows less than a causal L^2 / 2). Rematerialisation is
not counted (the usual MFU convention). Under LoRA the base's weight gradients are never
computed: 4 per parameter per token (forward + the activations' gradients); the adapters'
own FLOPs (rank r of each projection's width) are left out.
"""

from __future__ import annotations

import jax
import numpy as np

from cardjax.attention import dense_mask
from cardjax.model.config import ModelConfig
from cardjax.peaks import PEAK_FLOPS, peak_flops_for_kind  # noqa: F401 (re-exported)


def peak_flops_per_device(device=None) -> float | None:
  return peak_flops_for_kind((device or jax.devices()[0]).device_kind)


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


def train_flops_per_row(cfg: ModelConfig, model_tokens: int, pairs: float,
                        frozen_base: bool = False) -> float:
  """Training FLOPs for one row of `model_tokens` tokens with `pairs` visible pairs
  (frozen_base: a LoRA step, no weight gradients)."""
  dense = (4.0 if frozen_base else 6.0) * matmul_params(cfg) * model_tokens
  attention = 3.0 * 4.0 * cfg.resolved_head_dim * cfg.num_heads * cfg.num_layers * pairs
  return dense + attention


def train_flops_per_step(cfg: ModelConfig, objective, sample: dict, rows: int,
                         frozen_base: bool = False) -> float:
  """Training FLOPs of a step of `rows` rows, attention counted on `sample` (some rows of
  the batch as numpy arrays) corrupted as the objective corrupts them. Eager, on the host."""
  from cardjax.train.step import corrupt_rows, step_row_keys

  n, seq = sample["tokens"].shape
  inputs = corrupt_rows(objective, sample, step_row_keys(jax.random.key(0), 0, n))
  return rows * train_flops_per_row(cfg, seq * objective.stream_factor, visible_pairs(inputs),
                                    frozen_base)
