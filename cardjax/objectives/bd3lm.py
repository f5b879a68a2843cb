"""BD3LM: block diffusion (METHODS.md section 4, the MARS paper's "block diffusion" baseline).

The model reads [x_t | x_0] (length 2L): the noisy stream x_t FIRST (stream 1), then the
clean x_0 (stream 0), with shared position and segment ids, under MaskSpec("bd3lm", B):
noisy -> noisy within the block (bidirectional), noisy -> clean earlier blocks, clean ->
clean block-causal, clean -> noisy never.

A block is a run of B positions of one document: block index = position // B, and since
positions restart at 0 per packed document, every document has its own blocks. Each block
of each row draws its own t ~ U(t_eps, 1) (the blocks of a row are numbered by their order
in the row, so two packed documents never share a t); each maskable token of x_t is
replaced by [MASK] with its block's t, and every block with a maskable token gets at least
one mask (its token with the smallest random key).

Loss only on the x_t outputs, with mdlm's shift convention (default: the output at q
predicts x_q; shift=True: it predicts x_{q+1}), weight masked / t_block of the predicted
token; per row divided by the number of maskable tokens, then the mean over rows.
aux: t [B, L] (each token's block t), masked [B, L] int32 (of x_t), num_maskable [B].
"""

from __future__ import annotations

import jax.numpy as jnp

from cardjax.attention import MaskSpec
from cardjax.objectives.base import ModelInputs, Objective, token_ce
from cardjax.objectives.mdlm import (bernoulli_at_least_one, check_t_eps, diffusion_targets,
                                     maskable, require_block_size, require_mask_id, row_keys,
                                     row_normalized_mean, row_uniform)


def block_ordinals(positions, segment_ids, block_size: int):
  """[B, L] int32: the order (0, 1, ...) of each token's (document, position // B) block in
  its row. A new block starts at index 0, at a document change and at a block boundary."""
  blk = positions // block_size
  start = jnp.concatenate([jnp.ones_like(blk[:, :1], bool),
                           (segment_ids[:, 1:] != segment_ids[:, :-1])
                           | (blk[:, 1:] != blk[:, :-1])], axis=1)
  return (jnp.cumsum(start, axis=1) - 1).astype(jnp.int32)


def stream_inputs(x_t, x_0, positions, segment_ids, block_size: int) -> dict:
  """The model's [x_t | x_0] inputs (tokens, positions, segment_ids, streams, mask): the
  layout and attention mask training reads, shared with the harness's BD3LM ELBO
  (eval/harness/elbo.py) so that scoring sees what the model was trained on."""
  ones = jnp.ones_like(x_0)
  return dict(tokens=jnp.concatenate([x_t, x_0], axis=1),
              positions=jnp.concatenate([positions, positions], axis=1),
              segment_ids=jnp.concatenate([segment_ids, segment_ids], axis=1),
              streams=jnp.concatenate([ones, 0 * ones], axis=1),
              mask=MaskSpec("bd3lm", block_size))


class BD3LM(Objective):
  name = "bd3lm"
  stream_factor = 2

  def __init__(self, cfg, model_cfg):
    super().__init__(cfg, model_cfg)
    self.block_size = require_block_size(cfg, self.name)
    self.mask_id = require_mask_id(model_cfg, self.name)
    self.t_eps = check_t_eps(cfg, self.name)
    self.shift = bool(cfg.shift)

  def corrupt(self, batch, rng):
    tokens, pos, seg = batch["tokens"], batch["positions"], batch["segment_ids"]
    b, l = tokens.shape
    eligible = maskable(seg, batch["loss_mask"], self.shift)
    blocks = block_ordinals(pos, seg, self.block_size)  # [B, L] in [0, L)
    keys = row_keys(rng, b)
    t_blocks = self.t_eps + (1.0 - self.t_eps) * row_uniform(keys, (l,), 0)  # per ordinal
    t_pos = jnp.take_along_axis(t_blocks, blocks, axis=1)
    u = row_uniform(keys, (l,), 1)
    masked = bernoulli_at_least_one(u, t_pos, eligible, blocks, l)
    targets, weights = diffusion_targets(tokens, masked, t_pos, self.shift)
    x_t = jnp.where(masked, self.mask_id, tokens).astype(tokens.dtype)
    return ModelInputs(
        **stream_inputs(x_t, tokens, pos, seg, self.block_size),
        targets=jnp.concatenate([targets, jnp.zeros_like(targets)], axis=1),
        weights=jnp.concatenate([weights, jnp.zeros_like(weights)], axis=1),
        aux={"t": t_pos, "masked": masked.astype(jnp.int32),
             "num_maskable": jnp.sum(eligible, axis=1).astype(jnp.int32)})

  def loss(self, logits, inputs):
    l = inputs.tokens.shape[1] // 2
    ce = token_ce(logits[:, :l], inputs.targets[:, :l])
    n = inputs.aux["num_maskable"]
    loss = row_normalized_mean(ce, inputs.weights[:, :l], n)
    ratio = jnp.sum(inputs.aux["masked"]) / jnp.maximum(jnp.sum(n), 1)
    return loss, {"loss/bd3lm": loss, "bd3lm/mask_ratio": ratio.astype(jnp.float32),
                  "tokens/targets": jnp.sum(inputs.aux["masked"]).astype(jnp.float32)}
