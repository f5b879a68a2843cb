"""The policy-gradient loss of a batch of rollouts: a clipped importance-weighted surrogate
per token, a KL penalty to a reference policy, and one of three ways to average.

Per token t of rollout i, with the advantage A_i of its group (cardjax/rl/advantages.py),
the log-probability under the policy being trained (new), under the policy that sampled the
rollout (old: stored before the inner iterations) and under the reference (ref):

  ratio   = exp(new - old)
  policy  = -min(ratio A_i, clip(ratio, 1 - clip_low, 1 + clip_high) A_i)
  kl      = exp(ref - new) - (ref - new) - 1        (the k3 estimator: >= 0, unbiased)
  token   = policy + kl_coef * kl

and the loss over the rollouts' response tokens (mask 1), by `aggregation`:

  grpo     each rollout's token mean, then the mean over rollouts (DeepSeekMath)
  dr_grpo  each rollout's token sum / max_new_tokens, then the mean over rollouts
           (Dr. GRPO: a long wrong answer is not penalised less per token than a short one)
  dapo     the mean over every response token of the batch (DAPO's token-level loss)

clip_high > clip_low is DAPO's clip-higher. Metrics: the clip fraction (tokens whose ratio
left the band on the side that clips for their advantage's sign), the mean KL and ratio.
"""

from __future__ import annotations

import jax.numpy as jnp

AGGREGATIONS = ("grpo", "dr_grpo", "dapo")


def token_terms(new, old, ref, advantages, clip_low: float, clip_high: float,
                kl_coef: float):
  """(per-token loss, clipped indicator, kl), each [rollouts, T]; advantages [rollouts]."""
  adv = advantages[:, None]
  ratio = jnp.exp(new - old)
  clipped_ratio = jnp.clip(ratio, 1.0 - clip_low, 1.0 + clip_high)
  unclipped, clipped = ratio * adv, clipped_ratio * adv
  policy = -jnp.minimum(unclipped, clipped)
  was_clipped = (clipped < unclipped).astype(jnp.float32)
  kl = jnp.exp(ref - new) - (ref - new) - 1.0
  return policy + kl_coef * kl, was_clipped, kl, ratio


def aggregate(per_token, mask, aggregation: str, max_new_tokens: int):
  mask = mask.astype(per_token.dtype)
  if aggregation == "grpo":
    lengths = jnp.maximum(mask.sum(-1), 1.0)
    return ((per_token * mask).sum(-1) / lengths).mean()
  if aggregation == "dr_grpo":
    return ((per_token * mask).sum(-1) / max_new_tokens).mean()
  if aggregation == "dapo":
    return (per_token * mask).sum() / jnp.maximum(mask.sum(), 1.0)
  raise ValueError(f"aggregation {aggregation!r}: one of {AGGREGATIONS}")


def policy_loss(new, old, ref, advantages, mask, *, aggregation: str = "grpo",
                clip_low: float = 0.2, clip_high: float = 0.2, kl_coef: float = 0.0,
                max_new_tokens: int = 0):
  """(loss, metrics) over rollouts [R, T] of response tokens `mask`."""
  per_token, was_clipped, kl, ratio = token_terms(new, old, ref, advantages, clip_low,
                                                  clip_high, kl_coef)
  loss = aggregate(per_token, mask, aggregation, max_new_tokens or new.shape[-1])
  m = mask.astype(new.dtype)
  tokens = jnp.maximum(m.sum(), 1.0)
  metrics = {"clip_fraction": (was_clipped * m).sum() / tokens,
             "kl": (kl * m).sum() / tokens, "ratio": (ratio * m).sum() / tokens}
  return loss, metrics
