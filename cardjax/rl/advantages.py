"""Group-relative advantages: each prompt's G rollouts are scored against each other.

  grpo     A_i = (r_i - mean(r)) / (std(r) + eps)   (DeepSeekMath's GRPO; DAPO uses it too)
  dr_grpo  A_i = r_i - mean(r)                      (Dr. GRPO: no division by the spread,
                                                     which up-weights the easy and the
                                                     hopeless prompts whose spread is small)

`rewards` is [prompts, G]; the result has the same shape. A group whose rewards are all
equal has zero advantage everywhere: it teaches nothing (DAPO's dynamic sampling drops
such groups; `informative` says which are left). std is the population spread (ddof 0).
"""

from __future__ import annotations

import jax.numpy as jnp

EPS = 1e-6


def grpo(rewards: jnp.ndarray) -> jnp.ndarray:
  centred = rewards - rewards.mean(axis=-1, keepdims=True)
  return centred / (rewards.std(axis=-1, keepdims=True) + EPS)


def dr_grpo(rewards: jnp.ndarray) -> jnp.ndarray:
  return rewards - rewards.mean(axis=-1, keepdims=True)


ADVANTAGES = {"grpo": grpo, "dr_grpo": dr_grpo, "dapo": grpo}


def informative(rewards: jnp.ndarray) -> jnp.ndarray:
  """[prompts] bool: groups whose rewards differ (the others have no gradient)."""
  return rewards.max(axis=-1) > rewards.min(axis=-1)
