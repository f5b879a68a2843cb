"""MARS threshold decoding: several tokens per forward from one causal model.

Each forward reads [pending | B x MASK] against the KV cache: `pending` are the committed
tokens whose keys are not cached yet (at first the prompt's last token, later the tokens
accepted by the previous forward). Slot 0's distribution is the output at the last
pending token (an exact AR step), slot j's the output at mask j-1. Tokens are accepted
left to right while their confidence >= tau (tau < 1), always at least one; at tau = 1
exactly one, so the output is AR greedy token for token. tau is a runtime value; the
confidence rule (RULES: top prob, normalised entropy, top-2 margin) is static.

Cache use: each row has its own write index (KVCache.per_row). A row's window is written
at its index; its pending tokens are real and stay, the rest (padding after a shorter
pending run, the masks) is scratch, overwritten by the row's next window, which starts
right after those pending tokens. So a row's cache grows by exactly the tokens it
committed, the cache needs width + max_new_tokens + 2B slots whatever the batch, and that
is what every forward's attention reads.
"""

from __future__ import annotations

import dataclasses

import jax
import jax.numpy as jnp
import numpy as np
from flax import nnx

from cardjax.decoding.frozen import decode_loop
from cardjax.decoding.prompts import Generation, decode
from cardjax.decoding.reference import causal_logits
from cardjax.errors import CardjaxError
from cardjax.model.cache import KVCache


RULES = ("prob", "entropy", "margin")


def confidence(probs, rule: str = "prob"):
  """[..., vocab] probabilities -> [...] confidence in [0, 1] under `rule`: "prob" the top
  probability, "entropy" 1 - H(p) / log(vocab), "margin" top-1 minus top-2 probability."""
  if rule == "prob":
    return jnp.max(probs, axis=-1)
  if rule == "entropy":
    entropy = -jnp.sum(jax.scipy.special.xlogy(probs, probs), axis=-1)
    return 1.0 - entropy / jnp.log(probs.shape[-1])
  if rule == "margin":
    top2 = jax.lax.top_k(probs, 2)[0]
    return top2[..., 0] - top2[..., 1]
  raise CardjaxError(f"rule={rule!r} is not an acceptance rule; use one of {RULES}")


def accept_count(probs, tau, rule: str = "prob"):
  """Tokens accepted per row from probs [batch, slots, vocab]: the leading run of slots
  whose confidence >= tau, at least 1; exactly 1 when tau >= 1 for every rule, even where a
  confidence reaches 1 (a one-hot row), so tau = 1 is greedy AR."""
  ok = (confidence(probs, rule) >= tau) & (tau < 1.0)
  return jnp.maximum(1, jnp.sum(jnp.cumprod(ok.astype(jnp.int32), axis=1), axis=1))


def check_args(tau: float, block: int, mask_id: int, rule: str) -> None:
  """The user-facing argument checks shared by the MARS decoders."""
  if not 0.0 <= tau <= 1.0:
    raise CardjaxError(f"tau={tau} must lie in [0, 1] (1 = plain greedy AR)")
  if block < 1:
    raise CardjaxError(f"block={block} must be >= 1")
  if mask_id < 0:
    raise CardjaxError("MARS decoding needs the model's [MASK] id (model.mask_token_id)")
  if rule not in RULES:
    raise CardjaxError(f"rule={rule!r} is not an acceptance rule; use one of {RULES}")


@decode_loop("block", "max_new_tokens", "rule")
def _generate(graphdef, state, tokens, positions, segments, lengths, stop_ids, pad_id,
              mask_id, tau, block: int, max_new_tokens: int, rule: str):
  model = nnx.merge(graphdef, state)
  b, width = tokens.shape
  steps_max = max_new_tokens  # at least one token per forward
  # A row's index starts after the prompt less its last token and advances by the tokens
  # it commits (at most max_new + 1 with that token), then its window writes 2B slots.
  cache = KVCache.create(model.cfg, b, width + max_new_tokens + 2 * block)
  _, cache = model.forward_cached(tokens[:, :-1], cache, positions=positions[:, :-1],
                                  segment_ids=segments[:, :-1])
  cache = cache.per_row()
  pending = jnp.full((b, block), pad_id, jnp.int32).at[:, 0].set(tokens[:, -1])
  n_pending = jnp.ones((b,), jnp.int32)
  committed = lengths  # tokens of each row so far (prompt + generated)
  out = jnp.full((b, max_new_tokens + block), pad_id, jnp.int32)
  count = jnp.zeros((b,), jnp.int32)
  done = jnp.zeros((b,), bool)
  slot = jnp.arange(block)

  def cond(carry):
    return ~jnp.all(carry[5]) & (carry[7] < steps_max)

  def body(carry):
    cache, pending, n_pending, committed, out, done, count, forwards = carry
    valid = slot[None] < n_pending[:, None]
    pend_pos = committed[:, None] - n_pending[:, None] + slot[None]
    mask_pos = committed[:, None] + slot[None]
    window = jnp.concatenate([pending, jnp.full((b, block), mask_id, jnp.int32)], axis=1)
    pos = jnp.concatenate([jnp.where(valid, pend_pos, 0), mask_pos], axis=1)
    seg = jnp.concatenate([valid.astype(jnp.int32), jnp.ones((b, block), jnp.int32)], axis=1)
    start = cache.index
    logits, cache = model.forward_cached(window, cache, positions=pos, segment_ids=seg)
    # Keep the real pending keys: the next window starts after them (a done row stays put).
    cache = dataclasses.replace(cache, index=start + jnp.where(done, 0, n_pending))
    last = jnp.take_along_axis(logits[:, :block], (n_pending - 1)[:, None, None], axis=1)
    slot_logits = jnp.concatenate([last, logits[:, block:2 * block - 1]], axis=1)
    probs = jax.nn.softmax(slot_logits.astype(jnp.float32), axis=-1)
    guess = jnp.argmax(probs, axis=-1).astype(jnp.int32)
    k = accept_count(probs, tau, rule)
    # Stop at the first stop token and at the token budget.
    is_stop = jnp.isin(guess, stop_ids) & (slot[None] < k[:, None])
    first_stop = jnp.where(jnp.any(is_stop, axis=1), jnp.argmax(is_stop, axis=1) + 1, block)
    k = jnp.minimum(jnp.minimum(k, first_stop), max_new_tokens - count)
    k = jnp.where(done, 0, k)
    take = slot[None] < k[:, None]
    idx = jnp.where(take, count[:, None] + slot[None], max_new_tokens + block - 1)
    out = out.at[jnp.arange(b)[:, None], idx].set(jnp.where(take, guess, pad_id))
    done = done | jnp.any(is_stop & take, axis=1) | (count + k >= max_new_tokens)
    return (cache, jnp.where(take, guess, pad_id), jnp.maximum(k, 1), committed + k, out, done,
            count + k, forwards + 1)

  carry = (cache, pending, n_pending, committed, out, done, count, jnp.int32(0))
  carry = jax.lax.while_loop(cond, body, carry)
  return carry[4][:, :max_new_tokens], carry[6], carry[7]


def generate(model, prompts, max_new_tokens: int, block: int, tau: float, mask_id: int,
             stop_ids=(), pad_id: int = 0, rule: str = "prob") -> Generation:
  """MARS decoding of a batch of token-id prompts; `forwards` counts window forwards.
  `rule` picks the confidence compared with tau (see `confidence`)."""
  check_args(tau, block, mask_id, rule)
  return decode(_generate, model, prompts, max_new_tokens + block, stop_ids, pad_id,
                np.int32(mask_id), np.float32(tau), block=block,
                max_new_tokens=max_new_tokens, rule=rule)


def mars_by_recompute(model, prompt, max_new_tokens: int, block: int, tau: float,
                      mask_id: int, stop_ids=(), rule: str = "prob") -> tuple[list[int], int]:
  """The reference: one full causal forward over [committed | B masks] per step, no cache.
  Returns (tokens, forwards)."""
  seq, out, forwards = list(prompt), [], 0
  width = len(prompt) + max_new_tokens + block
  while len(out) < max_new_tokens:
    logits = causal_logits(model, seq + [mask_id] * block, width)[len(seq) - 1:-1]
    probs = jax.nn.softmax(logits.astype(jnp.float32), axis=-1)
    forwards += 1
    k = int(accept_count(probs[None], tau, rule)[0])
    for token in np.asarray(jnp.argmax(probs, axis=-1))[:k].tolist():
      out.append(token)
      seq.append(token)
      if token in stop_ids or len(out) == max_new_tokens:
        return out, forwards
  return out, forwards
