"""MARS decoding with a block-level KV cache, for batches.

The prompt is prefilled once and its last output gives the first token (an AR step). The
generated tokens then fill cache blocks of `cache_block` slots (independent of the
training block B). While a block is incomplete, a fill forward runs the whole block,
[committed | masks], against the cache as scratch: slot j >= n (n committed) takes its
distribution from output j-1, and tokens are accepted left to right by the MARS rule, up
to the block's end. Rows that have filled the block, or are done, wait (0 accepted). Once
every live row has filled it, one extension forward over the completed block writes its
keys for good, and its last output gives the next block's first token, an exact AR step.
So tau = 1 is AR greedy with one token per forward, and the cache never grows per
forward: all rows share its slots (left padding keeps the blocks aligned).

Acceptance window (`accept`): "block" (the default) accepts at most `block` tokens per
fill, the training B; "cache" up to the end of the cache block, as the reference does
(its cache block is also its acceptance window).

Sampling (temperature, top_p, seed: runtime values) as in `cardjax.decoding.mars`: every
token, the prefill's and the extensions' included, is drawn at temperature > 0; the rule
judges the model's own distribution. Temperature 0 is the greedy decoder.

`forwards` counts every model call that yields tokens: the prefill (which yields the
first token, counted like AR's first step), each fill and each extension forward.
"""

from __future__ import annotations

import dataclasses

import jax
import jax.numpy as jnp
import numpy as np
from flax import nnx

from cardjax.decoding import sampling
from cardjax.decoding.mars import accept_count, check_args, pick_tokens
from cardjax.decoding.frozen import decode_loop
from cardjax.decoding.prompts import Generation, decode
from cardjax.decoding.reference import causal_logits
from cardjax.errors import CardjaxError
from cardjax.model.cache import KVCache

ACCEPT = ("block", "cache")


def accept_span(block: int, cache_block: int, accept: str) -> int:
  """The most tokens one fill forward may accept."""
  if accept not in ACCEPT:
    raise CardjaxError(f"accept={accept!r} is not an acceptance window; use one of {ACCEPT}")
  return block if accept == "block" else cache_block


@decode_loop("block", "cache_block", "max_new_tokens", "rule", "accept")
def _generate(graphdef, state, tokens, positions, segments, lengths, stop_ids, pad_id,
              mask_id, tau, temperature, top_p, rng, block: int, cache_block: int,
              max_new_tokens: int, rule: str, accept: str):
  model = nnx.merge(graphdef, state)
  b, width = tokens.shape
  c = cache_block
  n_blocks = -(-max_new_tokens // c)
  cache = KVCache.create(model.cfg, b, width + c * n_blocks)
  logits, cache = model.forward_cached(tokens, cache, positions=positions,
                                       segment_ids=segments)

  def ar_step(last_logits, key):
    return pick_tokens(jnp.argmax(last_logits, axis=-1).astype(jnp.int32), last_logits, key,
                       temperature, top_p)

  rng, key = jax.random.split(rng)
  first = ar_step(logits[:, -1], key)
  # out holds every generated token; the current block is out[:, blk*c:(blk+1)*c].
  out = jnp.full((b, n_blocks * c), pad_id, jnp.int32).at[:, 0].set(first)
  done = jnp.isin(first, stop_ids) | (max_new_tokens == 1)
  rows = jnp.arange(b)[:, None]
  nowhere = n_blocks * c  # an out-of-range column: scatters there are dropped
  slot = jnp.arange(c)[None]
  span = accept_span(block, c, accept)
  ahead = jnp.arange(span)[None]

  def cond(carry):
    return ~jnp.all(carry[3])

  def body(carry):
    cache, out, n, done, count, blk, forwards, rng = carry
    forwards = forwards + (~done).astype(jnp.int32)  # per row: the forwards it was live in
    base = blk * c
    window = jnp.where(slot < n[:, None], jax.lax.dynamic_slice(out, (0, base), (b, c)),
                       mask_id)
    # A fill and the extension read the same window ([committed | masks], no masks left
    # once full), so one forward serves either; `full` picks what its outputs are used for.
    full = jnp.all(done | (n == c))
    start = cache.index
    logits, cache = model.forward_cached(window, cache, positions=lengths[:, None] + base + slot,
                                         segment_ids=jnp.ones_like(window))
    # Fill: slots n .. n+span-1 from outputs n-1 .. n+span-2 (clipped at the block end).
    src = jnp.minimum(n[:, None] - 1 + ahead, c - 1)
    fill_logits = jnp.take_along_axis(logits, src[..., None], axis=1)
    probs = jax.nn.softmax(fill_logits.astype(jnp.float32), axis=-1)
    rng, fill_key, next_key = jax.random.split(rng, 3)
    guess = pick_tokens(jnp.argmax(probs, axis=-1).astype(jnp.int32), fill_logits, fill_key,
                        temperature, top_p)
    k = jnp.minimum(accept_count(probs, tau, rule, guess), c - n)
    is_stop = jnp.isin(guess, stop_ids) & (ahead < k[:, None])
    first_stop = jnp.where(jnp.any(is_stop, axis=1), jnp.argmax(is_stop, axis=1) + 1, span)
    k = jnp.minimum(jnp.minimum(k, first_stop), max_new_tokens - count)
    k = jnp.where(done | full, 0, k)  # full rows and done rows wait
    take = ahead < k[:, None]
    at = jnp.where(take, base + n[:, None] + ahead, nowhere)
    out = out.at[rows, at].set(guess, mode="drop")
    done = done | jnp.any(is_stop & take, axis=1) | (count + k >= max_new_tokens)
    n, count = n + k, count + k
    # Extend: the block's keys stay (index is not rewound) and its last output is the next
    # block's first token; otherwise the window was scratch and the next one overwrites it.
    nxt = ar_step(logits[:, -1], next_key)
    grow = full & ~done
    out = out.at[rows[:, 0], jnp.where(grow, base + c, nowhere)].set(nxt, mode="drop")
    new_done = done | (grow & (jnp.isin(nxt, stop_ids) | (count + 1 >= max_new_tokens)))
    count = count + grow.astype(jnp.int32)
    n = jnp.where(full, 1, n)
    cache = dataclasses.replace(cache, index=jnp.where(full, start + c, start))
    return cache, out, n, new_done, count, blk + full.astype(jnp.int32), forwards, rng

  carry = (cache, out, jnp.ones((b,), jnp.int32), done, jnp.ones((b,), jnp.int32),
           jnp.int32(0), jnp.ones((b,), jnp.int32), rng)  # the prefill counts
  _, out, _, _, count, _, forwards, _ = jax.lax.while_loop(cond, body, carry)
  return out[:, :max_new_tokens], count, forwards


def generate(model, prompts, max_new_tokens: int, block: int, cache_block: int, tau: float,
             mask_id: int, stop_ids=(), pad_id: int = 0, rule: str = "prob",
             accept: str = "block", temperature: float = 0.0, top_p: float = 1.0,
             seed: int = 0, bucket: int | None = None) -> Generation:
  """MARS decoding of a batch of token-id prompts with the block-level KV cache.

  block: the training B, the most tokens one fill forward accepts with accept="block";
  accept="cache" lifts that cap to the end of the cache block. cache_block: the slots
  filled before the cache is extended (B_cache). tau, rule and sampling (temperature,
  top_p, seed) as in `cardjax.decoding.mars.generate`; all runtime values (no recompile).
  bucket: the prompt width bucket (default prompts.BUCKET)."""
  check_args(tau, block, mask_id, rule, temperature, top_p)
  if cache_block < 1:
    raise CardjaxError(f"cache_block={cache_block} must be >= 1 (slots per cache block)")
  accept_span(block, cache_block, accept)
  room = cache_block * -(-max_new_tokens // cache_block)
  return decode(_generate, model, prompts, room, stop_ids, pad_id, np.int32(mask_id),
                np.float32(tau), sampling.greedy_only(temperature), np.float32(top_p),
                jax.random.key(seed), bucket=bucket, block=block, cache_block=cache_block,
                max_new_tokens=max_new_tokens, rule=rule, accept=accept)


def block_by_recompute(model, prompt, max_new_tokens: int, block: int, cache_block: int,
                       tau: float, mask_id: int, stop_ids=(), rule: str = "prob",
                       accept: str = "block") -> tuple[list[int], int]:
  """The reference for one prompt, no cache: the same block schedule, each forward a full
  causal pass over [prompt | committed | masks to the block end]. Returns (tokens,
  forwards) with forwards counted as in `generate`."""
  c = cache_block
  span = accept_span(block, c, accept)
  width = len(prompt) + c * -(-max_new_tokens // c)
  seq, out = list(prompt), []
  forwards = 0
  while True:
    n = len(out) % c
    if n == 0:  # the prefill or an extension: one exact AR step over [prompt | committed]
      logits = causal_logits(model, seq, width)[-1:]
    else:  # a fill: masks to the block end, slot n from the output before it
      logits = causal_logits(model, seq + [mask_id] * (c - n), width)[len(seq) - 1:]
      logits = logits[:min(span, c - n)]
    forwards += 1
    probs = jax.nn.softmax(logits.astype(jnp.float32), axis=-1)
    k = 1 if n == 0 else int(accept_count(probs[None], tau, rule)[0])
    for token in np.asarray(jnp.argmax(probs, axis=-1))[:k].tolist():
      out.append(token)
      seq.append(token)
      if token in stop_ids or len(out) == max_new_tokens:
        return out, forwards
