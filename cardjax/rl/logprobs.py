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


def _masked_logprobs(logits_fn, inputs, tokens, scored, positions, segment_ids, shift):
  """log p(tokens[q]) read where `scored`; shift: output q predicts token q+1 (Dream
  style), else output q predicts token q (MDLM)."""
  logits = logits_fn(inputs, positions, segment_ids).astype(jnp.float32)
  if shift:  # the prediction of token q sits at output q - 1
    logits = jnp.concatenate([logits[:, :1], logits[:, :-1]], axis=1)
  logp = jax.nn.log_softmax(logits, axis=-1)
  picked = jnp.take_along_axis(logp, tokens[..., None], axis=-1)[..., 0]
  return jnp.where(scored, picked, 0.0)


def one_step_masked_logprobs(logits_fn, tokens, response, rng, mask_id: int,
                             prompt_mask_p: float = 0.15, positions=None, segment_ids=None,
                             shift: bool = False):
  """diffu-GRPO's one-step estimate for masked-diffusion models (MDLM, BD3LM): every
  response token masked, each prompt token masked with probability `prompt_mask_p`, one
  forward; [B, T] log p of each response token at its own position (0 elsewhere)."""
  b, t = tokens.shape
  positions = jnp.broadcast_to(jnp.arange(t, dtype=jnp.int32), (b, t)) \
      if positions is None else positions
  segment_ids = jnp.ones_like(tokens) if segment_ids is None else segment_ids
  response = response > 0
  hide_prompt = (jax.random.uniform(rng, tokens.shape) < prompt_mask_p) & ~response
  inputs = jnp.where(response | hide_prompt, mask_id, tokens)
  return _masked_logprobs(logits_fn, inputs, tokens, response, positions, segment_ids, shift)


def coupled_masked_logprobs(logits_fn, tokens, response, rng, mask_id: int,
                            positions=None, segment_ids=None, shift: bool = False):
  """Coupled sampling (DiffuCoder's coupled-GRPO): a random half of the response tokens is
  masked in one forward and the other half in a second; each response token is scored once,
  in the forward that masks it, with the rest of the response visible. [B, T] as above."""
  b, t = tokens.shape
  positions = jnp.broadcast_to(jnp.arange(t, dtype=jnp.int32), (b, t)) \
      if positions is None else positions
  segment_ids = jnp.ones_like(tokens) if segment_ids is None else segment_ids
  response = response > 0
  first = (jax.random.uniform(rng, tokens.shape) < 0.5) & response
  second = response & ~first
  out = jnp.zeros(tokens.shape, jnp.float32)
  for hidden in (first, second):
    inputs = jnp.where(hidden, mask_id, tokens)
    out = out + _masked_logprobs(logits_fn, inputs, tokens, hidden, positions, segment_ids,
                                 shift)
  return out
