"""Log-probabilities of rollouts for the RL loss.

AR and MARS score a rollout exactly in AR order: log p(x_t | x_<t) from one causal forward
over prompt + response. MARS's clean stream is a causal AR model, so its policy is that AR
model whichever decoder produced the rollout; a rollout from MARS at tau < 1 (or from CARD
blocks, DUS) is scored the same way, and the importance ratio of the loss is taken in that
AR-order likelihood (docs/rl.md says why).

`ar_token_logprobs` returns [B, T]: entry q is log p(tokens[q+1] | tokens[<= q]), valid
where `response[q+1]` is 1 (a response token follows in the same sequence); 0 elsewhere.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp


def ar_token_logprobs(logits_fn, tokens, response, positions=None, segment_ids=None):
  """(logprobs [B, T] float32, valid [B, T] bool); logits_fn(tokens, positions,
  segment_ids) -> [B, T, V] from a causal forward."""
  b, t = tokens.shape
  if positions is None:
    positions = jnp.broadcast_to(jnp.arange(t, dtype=jnp.int32), (b, t))
  if segment_ids is None:
    segment_ids = jnp.ones_like(tokens)
  logits = logits_fn(tokens, positions, segment_ids).astype(jnp.float32)
  targets = jnp.concatenate([tokens[:, 1:], jnp.zeros_like(tokens[:, :1])], axis=1)
  valid = jnp.concatenate([response[:, 1:] > 0, jnp.zeros_like(response[:, :1], bool)], 1)
  logp = jax.nn.log_softmax(logits, axis=-1)
  picked = jnp.take_along_axis(logp, targets[..., None], axis=-1)[..., 0]
  return jnp.where(valid, picked, 0.0), valid
