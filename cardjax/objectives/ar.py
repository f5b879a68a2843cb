"""Autoregressive next-token loss: pretraining, and SFT on response tokens only.

The loss mask of the batch decides which targets count: all tokens of a packed document
for pretraining, response tokens for SFT. Loss = mean CE over counted targets in the batch.
"""

from __future__ import annotations

import jax.numpy as jnp

from cardjax.attention import CAUSAL
from cardjax.objectives.base import (ModelInputs, Objective, masked_mean, next_token_targets,
                                     token_ce)


class AR(Objective):
  name = "ar"

  def corrupt(self, batch, rng):
    del rng  # nothing is corrupted
    targets, valid = next_token_targets(batch["tokens"], batch["segment_ids"],
                                        batch["loss_mask"])
    return ModelInputs(tokens=batch["tokens"], positions=batch["positions"],
                       segment_ids=batch["segment_ids"],
                       streams=jnp.zeros_like(batch["tokens"]), targets=targets,
                       weights=valid.astype(jnp.float32), mask=CAUSAL)

  def normalizer(self, inputs):
    return jnp.sum(inputs.weights)  # a token mean over the whole batch

  def loss(self, logits, inputs):
    ce = token_ce(logits, inputs.targets)
    loss = masked_mean(ce, inputs.weights)
    return loss, {"loss/ar": loss, "tokens/targets": jnp.sum(inputs.weights)}
