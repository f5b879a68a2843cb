"""MARS: Mask AutoRegression fine-tuning (METHODS.md section 2).

The model reads 2L tokens [clean x | noisy x~]: the same position and segment ids in both
halves, streams [0]*L + [1]*L. The noisy stream replaces EVERY response token (loss_mask 1)
by [MASK]; prompt tokens stay. No randomness: rng is unused.

Attention MaskSpec("dual_stream", B) compares position ids, so block beta(i) = position // B
and packed documents (positions restarting at 0) each have their own blocks.

In each stream the output at q predicts the clean x_{q+1}, counted where x_{q+1} is a
response token of the same document (base.next_token_targets).
Loss = CE_noisy + alpha * CE_clean; each term is per row sum over the row's response targets /
their number, then the mean over rows that have any.
"""

from __future__ import annotations

import jax.numpy as jnp

from cardjax.attention import MaskSpec
from cardjax.errors import ConfigError
from cardjax.objectives.base import (ModelInputs, Objective, next_token_targets, per_row_mean,
                                     token_ce)
from cardjax.objectives.mdlm import require_block_size, require_mask_id


class MARS(Objective):
  name = "mars"
  stream_factor = 2

  def __init__(self, cfg, model_cfg):
    super().__init__(cfg, model_cfg)
    self.block_size = require_block_size(cfg, self.name)
    self.alpha = float(cfg.alpha)
    if self.alpha < 0:
      raise ConfigError(f"objective.alpha={cfg.alpha!r}: the clean-stream weight must be >= 0")
    self.mask_id = require_mask_id(model_cfg, self.name)

  def corrupt(self, batch, rng):
    del rng  # MARS masks every response token: nothing random
    tokens, pos, seg, loss_mask = (batch["tokens"], batch["positions"], batch["segment_ids"],
                                   batch["loss_mask"])
    response = (loss_mask > 0) & (seg > 0)
    noisy = jnp.where(response, self.mask_id, tokens).astype(tokens.dtype)
    targets, valid = next_token_targets(tokens, seg, loss_mask)
    w = valid.astype(jnp.float32)
    zeros = jnp.zeros_like(tokens)
    return ModelInputs(
        tokens=jnp.concatenate([tokens, noisy], axis=1),
        positions=jnp.concatenate([pos, pos], axis=1),
        segment_ids=jnp.concatenate([seg, seg], axis=1),
        streams=jnp.concatenate([zeros, zeros + 1], axis=1),
        targets=jnp.concatenate([targets, targets], axis=1),
        weights=jnp.concatenate([w, w], axis=1),
        mask=MaskSpec("dual_stream", self.block_size))

  def loss(self, logits, inputs):
    l = inputs.tokens.shape[1] // 2
    ce = token_ce(logits, inputs.targets)
    clean = per_row_mean(ce[:, :l], inputs.weights[:, :l])
    noisy = per_row_mean(ce[:, l:], inputs.weights[:, l:])
    loss = noisy + self.alpha * clean
    return loss, {"loss/mars": loss, "mars/noisy": noisy, "mars/clean": clean,
                  "tokens/targets": jnp.sum(inputs.weights[:, :l])}
