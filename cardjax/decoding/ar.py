"""Autoregressive decoding with a KV cache: the speed and quality reference.

One jit: prefill every prompt at once (left-padded), then a `lax.while_loop` that feeds one
token per row per forward until every row has produced a stop token or max_new_tokens.
Greedy when temperature == 0, else temperature + top-p sampling; temperature and top_p are
runtime values (changing them does not recompile). Rows that finish early keep stepping
(static shapes) but their outputs are fixed to the pad id and not counted.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
from flax import nnx

from cardjax.decoding import sampling
from cardjax.decoding.frozen import decode_loop
from cardjax.decoding.prompts import Generation, decode
from cardjax.decoding.reference import causal_logits
from cardjax.model.cache import KVCache


def sample_tokens(logits, rng, temperature, top_p):
  """Greedy when temperature == 0 (None: statically, no random numbers drawn); else a draw
  from the top-p nucleus at temperature (sampling.py: no vocabulary sort). One temperature
  and top_p for every row."""
  if temperature is None:
    return sampling.sample(logits, None, None, top_p)
  u = jax.random.uniform(rng, logits.shape[:-1])
  return sampling.sample(logits, u, temperature, top_p)


@decode_loop("max_new_tokens")
def _generate(graphdef, state, tokens, positions, segments, lengths, stop_ids, pad_id,
              temperature, top_p, rng, max_new_tokens: int):
  model = nnx.merge(graphdef, state)
  b, width = tokens.shape
  cache = KVCache.create(model.cfg, b, width + max_new_tokens)
  # The prefill needs the last position's logits only.
  logits, cache = model.forward_cached(tokens, cache, positions=positions,
                                       segment_ids=segments,
                                       logits_at=jnp.full((b, 1), width - 1, jnp.int32))
  rng, key = jax.random.split(rng)
  first = sample_tokens(logits[:, -1], key, temperature, top_p)
  out = jnp.full((b, max_new_tokens), pad_id, jnp.int32).at[:, 0].set(first)
  done = jnp.isin(first, stop_ids)
  count = jnp.ones((b,), jnp.int32)

  def cond(carry):
    step, _, _, done, _, _, _ = carry
    return (step < max_new_tokens) & ~jnp.all(done)

  def body(carry):
    step, out, cache, done, count, rng, forwards = carry
    forwards = forwards + (~done).astype(jnp.int32)  # per row: the forwards it was live in
    last = out[:, step - 1][:, None]
    pos = (lengths + step - 1)[:, None]
    logits, cache = model.forward_cached(last, cache, positions=pos,
                                         segment_ids=jnp.ones_like(last))
    key = None
    if temperature is not None:  # the greedy program (temperature None) draws nothing
      rng, key = jax.random.split(rng)
    token = jnp.where(done, pad_id, sample_tokens(logits[:, -1], key, temperature, top_p))
    out = out.at[:, step].set(token)
    count = count + (~done).astype(jnp.int32)
    done = done | jnp.isin(token, stop_ids)
    return step + 1, out, cache, done, count, rng, forwards

  # The prefill counts, for every row.
  carry = (jnp.int32(1), out, cache, done, count, rng, jnp.ones((b,), jnp.int32))
  _, out, _, _, count, _, forwards = jax.lax.while_loop(cond, body, carry)
  return out, count, forwards


def generate(model, prompts, max_new_tokens: int, stop_ids=(), pad_id: int = 0,
             temperature: float = 0.0, top_p: float = 1.0, seed: int = 0,
             bucket: int | None = None) -> Generation:
  """Decode a batch of token-id prompts (lists of ints) with the KV cache; the prompts are
  left-padded to a multiple of `bucket` (default prompts.BUCKET)."""
  return decode(_generate, model, prompts, max_new_tokens, stop_ids, pad_id,
                sampling.greedy_only(temperature), np.float32(top_p), jax.random.key(seed),
                bucket=bucket, max_new_tokens=max_new_tokens)


def greedy_by_recompute(model, prompt, max_new_tokens: int, stop_ids=()) -> list[int]:
  """The reference: one full forward over the whole sequence per new token, no cache."""
  seq = list(prompt)
  out = []
  for _ in range(max_new_tokens):
    token = int(jnp.argmax(causal_logits(model, seq, len(prompt) + max_new_tokens)[-1]))
    out.append(token)
    seq.append(token)
    if token in stop_ids:
      break
  return out
