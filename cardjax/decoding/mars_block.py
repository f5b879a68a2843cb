"""MARS decoding with a block-level KV cache, for batches.

The prompt is prefilled once and its last output gives the first token (an AR step). The
generated tokens then fill cache blocks of `cache_block` slots (independent of the
training block B). While a block is incomplete, a fill forward runs the whole block,
[committed | masks], against the cache as scratch: slot j >= n (n committed) takes its
distribution from output j-1, and at most `block` tokens are accepted left to right by
the MARS rule, up to the block's end. Rows that have filled the block, or are done, wait
(0 accepted). Once every live row has filled it, one extension forward over the completed
block writes its keys for good, and its last output gives the next block's first token,
an exact AR step. So tau = 1 is AR greedy with one token per forward, and the cache never
grows per forward: all rows share its slots (left padding keeps the blocks aligned).

`forwards` counts every model call that yields tokens: the prefill (which yields the
first token, counted like AR's first step), each fill and each extension forward.
"""

from __future__ import annotations

import dataclasses

import jax
import jax.numpy as jnp
import numpy as np
from flax import nnx

from cardjax.decoding.mars import accept_count, check_args
from cardjax.decoding.frozen import decode_loop
from cardjax.decoding.prompts import Generation, decode
from cardjax.decoding.reference import causal_logits
from cardjax.errors import CardjaxError
from cardjax.model.cache import KVCache


@decode_loop("block", "cache_block", "max_new_tokens", "rule")
def _generate(graphdef, state, tokens, positions, segments, lengths, stop_ids, pad_id,
              mask_id, tau, block: int, cache_block: int, max_new_tokens: int, rule: str):
  model = nnx.merge(graphdef, state)
  b, width = tokens.shape
  c = cache_block
  n_blocks = -(-max_new_tokens // c)
  cache = KVCache.create(model.cfg, b, width + c * n_blocks)
  logits, cache = model.forward_cached(tokens, cache, positions=positions,
                                       segment_ids=segments)
  first = jnp.argmax(logits[:, -1], axis=-1).astype(jnp.int32)
  # out holds every generated token; the current block is out[:, blk*c:(blk+1)*c].
  out = jnp.full((b, n_blocks * c), pad_id, jnp.int32).at[:, 0].set(first)
  done = jnp.isin(first, stop_ids) | (max_new_tokens == 1)
  rows = jnp.arange(b)[:, None]
  nowhere = n_blocks * c  # an out-of-range column: scatters there are dropped
  slot = jnp.arange(c)[None]
  ahead = jnp.arange(block)[None]

  def cond(carry):
    return ~jnp.all(carry[3])

  def body(carry):
    cache, out, n, done, count, blk, forwards = carry
    base = blk * c
    window = jnp.where(slot < n[:, None], jax.lax.dynamic_slice(out, (0, base), (b, c)),
                       mask_id)
    # A fill and the extension read the same window ([committed | masks], no masks left
    # once full), so one forward serves either; `full` picks what its outputs are used for.
    full = jnp.all(done | (n == c))
    start = cache.index
    logits, cache = model.forward_cached(window, cache, positions=lengths[:, None] + base + slot,
                                         segment_ids=jnp.ones_like(window))
    # Fill: slots n .. n+block-1 from outputs n-1 .. n+block-2 (clipped at the block end).
    src = jnp.minimum(n[:, None] - 1 + ahead, c - 1)
    probs = jax.nn.softmax(
        jnp.take_along_axis(logits, src[..., None], axis=1).astype(jnp.float32), axis=-1)
    guess = jnp.argmax(probs, axis=-1).astype(jnp.int32)
    k = jnp.minimum(accept_count(probs, tau, rule), c - n)
    is_stop = jnp.isin(guess, stop_ids) & (ahead < k[:, None])
    first_stop = jnp.where(jnp.any(is_stop, axis=1), jnp.argmax(is_stop, axis=1) + 1, block)
    k = jnp.minimum(jnp.minimum(k, first_stop), max_new_tokens - count)
    k = jnp.where(done | full, 0, k)  # full rows and done rows wait
    take = ahead < k[:, None]
    at = jnp.where(take, base + n[:, None] + ahead, nowhere)
    out = out.at[rows, at].set(guess, mode="drop")
    done = done | jnp.any(is_stop & take, axis=1) | (count + k >= max_new_tokens)
    n, count = n + k, count + k
    # Extend: the block's keys stay (index is not rewound) and its last output is the next
    # block's first token; otherwise the window was scratch and the next one overwrites it.
    nxt = jnp.argmax(logits[:, -1], axis=-1).astype(jnp.int32)
    grow = full & ~done
    out = out.at[rows[:, 0], jnp.where(grow, base + c, nowhere)].set(nxt, mode="drop")
    new_done = done | (grow & (jnp.isin(nxt, stop_ids) | (count + 1 >= max_new_tokens)))
    count = count + grow.astype(jnp.int32)
    n = jnp.where(full, 1, n)
    cache = dataclasses.replace(cache, index=jnp.where(full, start + c, start))
    return cache, out, n, new_done, count, blk + full.astype(jnp.int32), forwards + 1

  carry = (cache, out, jnp.ones((b,), jnp.int32), done, jnp.ones((b,), jnp.int32),
           jnp.int32(0), jnp.int32(1))
  _, out, _, _, count, _, forwards = jax.lax.while_loop(cond, body, carry)
  return out[:, :max_new_tokens], count, forwards


def generate(model, prompts, max_new_tokens: int, block: int, cache_block: int, tau: float,
             mask_id: int, stop_ids=(), pad_id: int = 0, rule: str = "prob") -> Generation:
  """MARS decoding of a batch of token-id prompts with the block-level KV cache.

  block: the most tokens one fill forward accepts (the training B); cache_block: the
  slots filled before the cache is extended (B_cache). tau and rule as in
  `cardjax.decoding.mars.generate`; tau is a runtime value (no recompile)."""
  check_args(tau, block, mask_id, rule)
  if cache_block < 1:
    raise CardjaxError(f"cache_block={cache_block} must be >= 1 (slots per cache block)")
  span = cache_block * -(-max_new_tokens // cache_block)
  return decode(_generate, model, prompts, span, stop_ids, pad_id, np.int32(mask_id),
                np.float32(tau), block=block, cache_block=cache_block,
                max_new_tokens=max_new_tokens, rule=rule)


def block_by_recompute(model, prompt, max_new_tokens: int, block: int, cache_block: int,
                       tau: float, mask_id: int, stop_ids=(),
                       rule: str = "prob") -> tuple[list[int], int]:
  """The reference for one prompt, no cache: the same block schedule, each forward a full
  causal pass over [prompt | committed | masks to the block end]. Returns (tokens,
  forwards) with forwards counted as in `generate`."""
  c = cache_block
  width = len(prompt) + c * -(-max_new_tokens // c)
  seq, out = list(prompt), []
  forwards = 0
  while True:
    n = len(out) % c
    if n == 0:  # the prefill or an extension: one exact AR step over [prompt | committed]
      logits = causal_logits(model, seq, width)[-1:]
    else:  # a fill: masks to the block end, slot n from the output before it
      logits = causal_logits(model, seq + [mask_id] * (c - n), width)[len(seq) - 1:]
      logits = logits[:min(block, c - n)]
    forwards += 1
    probs = jax.nn.softmax(logits.astype(jnp.float32), axis=-1)
    k = 1 if n == 0 else int(accept_count(probs[None], tau, rule)[0])
    for token in np.asarray(jnp.argmax(probs, axis=-1))[:k].tolist():
      out.append(token)
      seq.append(token)
      if token in stop_ids or len(out) == max_new_tokens:
        return out, forwards
