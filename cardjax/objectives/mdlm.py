"""MDLM: bidirectional masked diffusion (METHODS.md section 4, a baseline).

Per row t ~ U(t_eps, 1) (t_draw=stratified: the step's rows spread evenly over [0, 1), the
MDLM paper's low-discrepancy sampler; each row is still uniform); every maskable token is
replaced by [MASK] with probability t, and at least one per row is (the one with the
smallest random key), so no row is wasted. The model reads the corrupted row under a
bidirectional mask (within each packed document).

  shift=False (LLaDA style): the output at q predicts the clean token at q;
                              weight = masked(q) / t.
  shift=True  (Dream style, right-shifted logits): the output at q predicts x_{q+1};
                              weight = masked(q+1) / t.

Maskable tokens: loss-carrying tokens of a real segment; with shift=True also only those
whose predecessor lies in the same document (a document's first token can never be a
target, so it is never masked and always stays visible as context).
Loss: per row sum_q weight_q * CE_q / (number of maskable tokens in the row), then the mean
over rows that have any maskable token (the rows the base normalizer counts: every such
row has a mask). aux: t [B], masked [B, L] int32, num_maskable [B].

This module also holds the helpers the other diffusion objectives share.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp

from cardjax.attention import BIDIRECTIONAL
from cardjax.errors import ConfigError
from cardjax.objectives.base import ModelInputs, Objective, token_ce


# --- helpers shared by card / mars / mdlm / bd3lm ---------------------------------------------

def require_block_size(cfg, objective: str) -> int:
  """objective.block_size as an int; a ConfigError unless it is > 0."""
  block = int(cfg.block_size)
  if block <= 0:
    raise ConfigError(f"objective.block_size={cfg.block_size!r}: {objective} needs a block "
                      "length > 0 (the MARS paper uses 4, 8 or 16)")
  return block


def require_mask_id(model_cfg, objective: str) -> int:
  """model.mask_token_id as an int; a ConfigError when unset (-1) or outside the vocab."""
  mask_id = int(getattr(model_cfg, "mask_token_id", -1))
  vocab = getattr(model_cfg, "vocab_size", None)
  if mask_id < 0:
    raise ConfigError(f"objective {objective!r} needs a [MASK] token: set model.mask_token_id "
                      f"(it is {mask_id}); for Qwen2.5 the first free id is 151665")
  if vocab is not None and mask_id >= int(vocab):
    raise ConfigError(f"model.mask_token_id={mask_id} lies outside the vocabulary "
                      f"(model.vocab_size={vocab})")
  return mask_id


def check_t_eps(cfg, objective: str) -> float:
  t_eps = float(cfg.t_eps)
  if not 0.0 <= t_eps < 1.0:
    raise ConfigError(f"objective.t_eps={t_eps!r} ({objective}): must lie in [0, 1)")
  return t_eps


T_DRAWS = ("independent", "stratified")


def check_t_draw(cfg, objective: str) -> str:
  draw = str(cfg.get("t_draw", "independent"))
  if draw not in T_DRAWS:
    raise ConfigError(f"objective.t_draw={draw!r} ({objective}): choose one of {T_DRAWS}")
  return draw


def row_keys(rng, batch_size: int):
  """One key per row: fold_in(rng, row index), so row i's draw depends on (rng, i) only."""
  return jax.vmap(lambda i: jax.random.fold_in(rng, i))(jnp.arange(batch_size))


def row_uniform(keys, shape, salt: int):
  """Per-row uniforms [B, *shape] in [0, 1) from the per-row keys and a salt per use."""
  return jax.vmap(lambda k: jax.random.uniform(jax.random.fold_in(k, salt), shape))(keys)


def shift_left(x):
  """x[:, q + 1] at q, zero at the last position."""
  return jnp.concatenate([x[:, 1:], jnp.zeros_like(x[:, :1])], axis=1)


def maskable(segment_ids, loss_mask, shift: bool):
  """Tokens the diffusion objectives may mask (see the module docstring)."""
  ok = (loss_mask > 0) & (segment_ids > 0)
  if shift:
    prev_same = jnp.concatenate([jnp.zeros_like(ok[:, :1]),
                                 segment_ids[:, 1:] == segment_ids[:, :-1]], axis=1)
    ok = ok & prev_same
  return ok


def bernoulli_at_least_one(u, t, eligible, groups, num_groups: int):
  """masked = eligible & (u < t), plus, in every group with an eligible token, the eligible
  token with the smallest u (ties: all of the smallest). u, t: [B, L] float; groups: [B, L]
  int32 ids in [0, num_groups)."""
  keyed = jnp.where(eligible, u, jnp.inf)
  gmin = jax.vmap(lambda k, g: jax.ops.segment_min(k, g, num_segments=num_groups))(keyed, groups)
  smallest = eligible & (keyed <= jnp.take_along_axis(gmin, groups, axis=1))
  return eligible & ((u < t) | smallest)


def row_normalized_mean(values, weights, counts):
  """Per row sum(w * v) / count, then the mean over rows with count > 0."""
  counts = counts.astype(jnp.float32)
  row = jnp.sum(values * weights, axis=1) / jnp.maximum(counts, 1.0)
  has = (counts > 0).astype(jnp.float32)
  return jnp.sum(row * has) / jnp.maximum(jnp.sum(has), 1.0)


def diffusion_targets(tokens, masked, t_pos, shift: bool):
  """(targets, weights) of one stream: weight masked/t at the predicted position."""
  w = masked.astype(jnp.float32) / t_pos
  if shift:
    return shift_left(tokens), shift_left(w)
  return tokens, w


# --- MDLM -------------------------------------------------------------------------------------

class MDLM(Objective):
  name = "mdlm"

  def __init__(self, cfg, model_cfg):
    super().__init__(cfg, model_cfg)
    self.mask_id = require_mask_id(model_cfg, self.name)
    self.t_eps = check_t_eps(cfg, self.name)
    self.shift = bool(cfg.shift)
    self.low_discrepancy = check_t_draw(cfg, self.name) == "stratified"

  def corrupt(self, batch, rng):
    tokens, seg = batch["tokens"], batch["segment_ids"]
    b, l = tokens.shape
    eligible = maskable(seg, batch["loss_mask"], self.shift)
    keys = row_keys(rng, b)
    # The trainer hands each row its stratum (train/step.py:step_strata); a direct call
    # without one draws t independently, as t_draw=independent does.
    u = batch["stratum"] if self.low_discrepancy and "stratum" in batch else None
    if u is None:
      u = row_uniform(keys, (), 0)
    t = self.t_eps + (1.0 - self.t_eps) * u  # [B]
    u = row_uniform(keys, (l,), 1)
    t_pos = jnp.broadcast_to(t[:, None], (b, l))
    masked = bernoulli_at_least_one(u, t_pos, eligible, jnp.zeros((b, l), jnp.int32), 1)
    targets, weights = diffusion_targets(tokens, masked, t_pos, self.shift)
    return ModelInputs(
        tokens=jnp.where(masked, self.mask_id, tokens).astype(tokens.dtype),
        positions=batch["positions"], segment_ids=seg, streams=jnp.zeros_like(tokens),
        targets=targets, weights=weights,
        aux={"t": t, "masked": masked.astype(jnp.int32),
             "num_maskable": jnp.sum(eligible, axis=1).astype(jnp.int32)},
        mask=BIDIRECTIONAL)

  def loss(self, logits, inputs):
    ce = token_ce(logits, inputs.targets)
    n = inputs.aux["num_maskable"]
    loss = row_normalized_mean(ce, inputs.weights, n)
    ratio = jnp.sum(inputs.aux["masked"]) / jnp.maximum(jnp.sum(n), 1)
    return loss, {"loss/mdlm": loss, "mdlm/mask_ratio": ratio.astype(jnp.float32),
                  "tokens/targets": jnp.sum(inputs.aux["masked"]).astype(jnp.float32)}
