"""The contract between a training objective and the trainer.

An objective is two pure functions that run inside the jitted, sharded train step:

  corrupt(batch, rng) -> ModelInputs   the clean batch from the data pipeline (tokens,
                                       positions, segment_ids, loss_mask: [B, L] int32)
                                       becomes what the model reads and what it must predict
  loss(logits, inputs) -> (loss, metrics)

with rng = fold_in(seed, step), so a resumed run draws the same corruption. ModelInputs
holds per-token arrays of the model's length T (L, or 2L for two-stream objectives) plus
the static attention MaskSpec; `aux` carries objective-specific arrays (e.g. t per row).
"""

from __future__ import annotations

import dataclasses
from typing import Any

import jax
import jax.numpy as jnp
import optax

from cardjax.attention import MaskSpec
from cardjax.objectives.chunked_ce import HeadInputs, chunked_ce


@jax.tree_util.register_dataclass
@dataclasses.dataclass
class ModelInputs:
  tokens: jax.Array  # [B, T] int32, what the model reads (corrupted)
  positions: jax.Array  # [B, T] int32 position ids (shared by the two streams)
  segment_ids: jax.Array  # [B, T] int32, 0 = padding
  streams: jax.Array  # [B, T] int32, 0 clean / 1 noisy
  targets: jax.Array  # [B, T] int32, the token the output at each position predicts
  weights: jax.Array  # [B, T] float32 loss weight of each output (0 = no loss)
  aux: dict[str, Any] = dataclasses.field(default_factory=dict)
  mask: MaskSpec = dataclasses.field(default=MaskSpec("causal"), metadata=dict(static=True))


def next_token_targets(tokens, segment_ids, loss_mask):
  """Targets and validity for "the output at q predicts the token at q+1".

  Valid where q+1 exists, lies in the same (non-padding) segment and carries loss.
  """
  targets = jnp.concatenate([tokens[:, 1:], jnp.zeros_like(tokens[:, :1])], axis=1)
  same = jnp.concatenate([(segment_ids[:, 1:] == segment_ids[:, :-1]) & (segment_ids[:, 1:] > 0),
                          jnp.zeros_like(segment_ids[:, :1], bool)], axis=1)
  carries = jnp.concatenate([loss_mask[:, 1:] > 0, jnp.zeros_like(loss_mask[:, :1], bool)],
                            axis=1)
  return targets, same & carries


def token_ce(logits, targets):
  """Per-position cross-entropy in float32: [B, T]. `logits` may be a HeadInputs (the
  features and the LM head, train.loss_chunk > 0): then a chunk of positions at a time."""
  if isinstance(logits, HeadInputs):
    return chunked_ce(logits, targets)
  return optax.softmax_cross_entropy_with_integer_labels(logits.astype(jnp.float32), targets)


def masked_mean(values, weights):
  """sum(w * v) / sum(w), 0 when no weight."""
  total = jnp.sum(weights)
  return jnp.sum(values * weights) / jnp.maximum(total, 1e-9)


def per_row_mean(values, weights):
  """Each row's weighted mean, then the mean over rows that have any weight."""
  row_w = jnp.sum(weights, axis=1)
  row = jnp.sum(values * weights, axis=1) / jnp.maximum(row_w, 1e-9)
  has = (row_w > 0).astype(jnp.float32)
  return jnp.sum(row * has) / jnp.maximum(jnp.sum(has), 1.0)


class Objective:
  """Base class; subclasses set `name` and implement corrupt and loss."""

  name = "base"
  # Tokens the model processes per data token (2 for the two-stream objectives): the
  # trainer's throughput and MFU count model tokens.
  stream_factor = 1

  def __init__(self, cfg, model_cfg):
    self.cfg = cfg  # the config's `objective` section
    self.model_cfg = model_cfg

  def corrupt(self, batch: dict, rng: jax.Array) -> ModelInputs:
    raise NotImplementedError

  def loss(self, logits: jax.Array, inputs: ModelInputs) -> tuple[jax.Array, dict]:
    raise NotImplementedError

  def nonfinite_hint(self, metrics: dict) -> tuple[str, str] | None:
    """(cause, fix) when this objective made a step's loss non-finite on purpose, read from
    the step's metrics by the trainer's NaN stop; None: no cause it knows of."""
    return None

  def normalizer(self, inputs: ModelInputs) -> jax.Array:
    """What the loss is a mean over, so gradient accumulation can weight micro-batches
    exactly: the rows that carry any loss (the per-row-mean objectives)."""
    return jnp.sum(jnp.any(inputs.weights > 0, axis=1).astype(jnp.float32))

  def ar_nll(self, logits_fn, batch: dict) -> jax.Array:
    """Plain next-token NLL of the clean batch under a causal forward (validation)."""
    targets, valid = next_token_targets(batch["tokens"], batch["segment_ids"],
                                        batch["loss_mask"])
    logits = logits_fn(batch["tokens"], batch["positions"], batch["segment_ids"])
    return masked_mean(token_ce(logits, targets), valid.astype(jnp.float32))
