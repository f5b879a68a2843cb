"""CARD: Causal Autoregressive Diffusion pretraining (METHODS.md section 1).

A plain causal decoder reads a corrupted row and predicts the CLEAN next token at every
position: input x_t (masked positions hold [MASK]), target at output q the clean x_{q+1},
the loss over all valid targets (masked or not), no 1/t factor, no timestep embedding.

Masking, per row (one t ~ U(0, 1) per row, the row being the unit "sequence"):
  maskable  the row's loss-carrying tokens of real segments; L_eff = their number (L for a
            full pretraining row; padding at the end of a row is not maskable, so the tail
            window ends at the last REAL token, not at the end of the row).
  soft_tail N = max(1, floor(L_eff * t)) tokens, drawn uniformly without replacement from the
            last W = min(L_eff, floor(lambda * N)) maskable tokens of the row; the others stay
            clean (lambda = card_lambda, must be >= 1).
  strict_tail  the same with lambda = 1: exactly the last N maskable tokens.
  uniform   every maskable token masked independently with probability t (may mask none).
  clean_fraction  each row, with this probability, is left entirely clean.
A row with no maskable token gets no mask. Several packed documents in a row share the one
tail window (it lies in the row's last documents).

Context-aware reweighting (card_reweighting = "context"), with m_i the masked indicator:
  C_i = m_i * (1 + m_{i-1}),  S_q = C_q + (1 - p) * S_{q-1},  w_q = 1 / (beta + S_q)
Both the m_{i-1} term and the S recursion restart at a document boundary (a position's
context is what it attends to: its own document), so for one document per row this is
exactly S_q = sum_{i <= q} C_i (1-p)^(q-i). "none": w_q = 1.
Loss = per row sum_q w_q CE_q / sum_q w_q over valid targets, then the mean over rows.

aux: t [B], masked [B, L] int32, num_maskable [B] (L_eff), valid [B, L] int32 (targets).
"""

from __future__ import annotations

import jax
import jax.numpy as jnp

from cardjax.attention import CAUSAL
from cardjax.errors import ConfigError
from cardjax.objectives.base import (ModelInputs, Objective, next_token_targets, per_row_mean,
                                     token_ce)
from cardjax.objectives.mdlm import require_mask_id, row_keys, row_uniform

MASKINGS = ("soft_tail", "strict_tail", "uniform")
REWEIGHTINGS = ("context", "none")


def tail_mask(u, eligible, t, lam: float):
  """soft/strict tail: exactly N of the last W eligible positions of each row (see module).

  u: [B, L] uniform keys; the N window positions with the smallest keys are masked (ranks by
  a stable sort, so ties in u never change the count)."""
  l_eff = jnp.sum(eligible, axis=1).astype(jnp.int32)
  n = jnp.maximum(1, jnp.floor(l_eff.astype(jnp.float32) * t).astype(jnp.int32))
  n = jnp.minimum(n, l_eff)  # 0 for a row without maskable tokens
  w = jnp.minimum(l_eff, jnp.floor(lam * n.astype(jnp.float32)).astype(jnp.int32))
  from_end = jnp.cumsum(eligible[:, ::-1].astype(jnp.int32), axis=1)[:, ::-1]
  window = eligible & (from_end <= w[:, None])
  keyed = jnp.where(window, u, jnp.inf)
  rank = jnp.argsort(jnp.argsort(keyed, axis=1, stable=True), axis=1, stable=True)
  return window & (rank < n[:, None]), n, w


def context_weights(masked, segment_ids, beta: float, p: float):
  """w_q = 1 / (beta + S_q) with the recursion restarting at every document start."""
  m = masked.astype(jnp.float32)
  same_prev = jnp.concatenate([jnp.zeros_like(segment_ids[:, :1], bool),
                               segment_ids[:, 1:] == segment_ids[:, :-1]], axis=1)
  m_prev = jnp.concatenate([jnp.zeros_like(m[:, :1]), m[:, :-1]], axis=1) * same_prev
  c = m * (1.0 + m_prev)
  decay = jnp.where(same_prev, 1.0 - p, 0.0).astype(jnp.float32)

  def combine(left, right):  # S = a * S_prev + c composed left then right
    a1, b1 = left
    a2, b2 = right
    return a1 * a2, a2 * b1 + b2

  _, s = jax.lax.associative_scan(combine, (decay, c), axis=1)
  return 1.0 / (beta + s)


class CARD(Objective):
  name = "card"

  def __init__(self, cfg, model_cfg):
    super().__init__(cfg, model_cfg)
    self.mask_id = require_mask_id(model_cfg, self.name)
    self.masking = str(cfg.card_masking)
    if self.masking not in MASKINGS:
      raise ConfigError(f"objective.card_masking={cfg.card_masking!r} is unknown; choose one "
                        f"of {MASKINGS}")
    self.lam = 1.0 if self.masking == "strict_tail" else float(cfg.card_lambda)
    if self.masking == "soft_tail" and self.lam < 1.0:
      raise ConfigError(f"objective.card_lambda={cfg.card_lambda!r}: the tail window must "
                        f"hold the N masks, so lambda >= 1 (1 = strict tail)")
    self.reweighting = str(cfg.card_reweighting)
    if self.reweighting not in REWEIGHTINGS:
      raise ConfigError(f"objective.card_reweighting={cfg.card_reweighting!r} is unknown; "
                        f"choose one of {REWEIGHTINGS}")
    self.beta, self.p = float(cfg.card_beta), float(cfg.card_p)
    if self.beta <= 0:
      raise ConfigError(f"objective.card_beta={cfg.card_beta!r}: must be > 0 "
                        f"(w = 1 / (beta + S) with S = 0 on clean context)")
    if not 0.0 <= self.p <= 1.0:
      raise ConfigError(f"objective.card_p={cfg.card_p!r}: the decay must lie in [0, 1]")
    self.clean_fraction = float(cfg.clean_fraction)
    if not 0.0 <= self.clean_fraction <= 1.0:
      raise ConfigError(f"objective.clean_fraction={cfg.clean_fraction!r}: must lie in [0, 1]")

  def corrupt(self, batch, rng):
    tokens, seg, loss_mask = batch["tokens"], batch["segment_ids"], batch["loss_mask"]
    b, l = tokens.shape
    eligible = (loss_mask > 0) & (seg > 0)
    keys = row_keys(rng, b)
    t = row_uniform(keys, (), 0)  # [B] in [0, 1)
    u = row_uniform(keys, (l,), 1)
    if self.masking == "uniform":
      masked = eligible & (u < t[:, None])
    else:
      masked, _, _ = tail_mask(u, eligible, t, self.lam)
    clean_row = row_uniform(keys, (), 2) < self.clean_fraction
    masked = masked & ~clean_row[:, None]

    targets, valid = next_token_targets(tokens, seg, loss_mask)
    if self.reweighting == "context":
      w = context_weights(masked, seg, self.beta, self.p)
    else:
      w = jnp.ones((b, l), jnp.float32)
    return ModelInputs(
        tokens=jnp.where(masked, self.mask_id, tokens).astype(tokens.dtype),
        positions=batch["positions"], segment_ids=seg, streams=jnp.zeros_like(tokens),
        targets=targets, weights=w * valid,
        aux={"t": t, "masked": masked.astype(jnp.int32),
             "num_maskable": jnp.sum(eligible, axis=1).astype(jnp.int32),
             "valid": valid.astype(jnp.int32)},
        mask=CAUSAL)

  def loss(self, logits, inputs):
    ce = token_ce(logits, inputs.targets)
    loss = per_row_mean(ce, inputs.weights)
    valid = inputs.aux["valid"].astype(jnp.float32)
    ratio = jnp.sum(inputs.aux["masked"]) / jnp.maximum(jnp.sum(inputs.aux["num_maskable"]), 1)
    mean_w = jnp.sum(inputs.weights) / jnp.maximum(jnp.sum(valid), 1.0)
    return loss, {"loss/card": loss, "card/mask_ratio": ratio.astype(jnp.float32),
                  "card/mean_weight": mean_w, "tokens/targets": jnp.sum(valid)}
