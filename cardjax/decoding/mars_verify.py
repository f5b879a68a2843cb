"""Self-verified MARS decoding: several tokens per forward, lossless against AR greedy.

Each forward reads [p | d_1..d_m | M_1..M_B] against the KV cache: p is the last verified
token (its key not cached yet), d_i the drafts from the previous forward as ordinary
tokens (m is 0 or B), then B masks. Under the causal mask the outputs at p, d_1..d_m are
exact AR greedy predictions g_0..g_m (g_i predicts the slot after window slot i). Drafts
are kept while d_{i+1} == g_i; the a kept drafts plus g_a (the AR token at the first
mismatch, or the bonus token when all match) are committed, so at least one token per
forward and the output is AR greedy token for token. When every draft was kept, g_a sits
in M_1's slot and the outputs at M_1..M_B predict the B tokens after it: those are the
next drafts. Otherwise the masks were conditioned on a wrong draft, so the next forward
has none.

Window width (`window`): a row without drafts needs only [p | M_1..M_B]. With "fit" (the
default) a forward in which no live row has drafts reads those 1 + B tokens, the others
1 + 2B (two inner while loops of static shape, each running while its window is the one
needed); "full" always reads 1 + 2B. Both give the same tokens and forwards.

Cache use: each row has its own write index (KVCache.per_row). A row's window is written
at its index and the index advances past p and the kept drafts, so the rest (padding,
rejected drafts, masks) is scratch that the row's next window overwrites: the cache holds
width + max_new_tokens + 2B slots whatever the batch. A narrow window does not cover all
of a wide one's scratch, and causal attention decides visibility by position, not slot:
with "fit" the slots past the new index are marked empty before the windows narrow (after
the wide loop, not every forward: a window as wide covers the last one's). `forwards`
counts the window forwards (the prefill of all but the last prompt token yields nothing),
so forwards <= tokens.
"""

from __future__ import annotations

import dataclasses

import jax
import jax.numpy as jnp
import numpy as np
from flax import nnx

from cardjax.decoding.frozen import decode_loop
from cardjax.decoding.mars import WINDOWS
from cardjax.decoding.prompts import Generation, decode
from cardjax.errors import CardjaxError
from cardjax.model.cache import KVCache


def accept_drafts(drafts, n_drafts, greedy):
  """(commit, all_kept) per row. drafts [b, B] with n_drafts [b] valid; greedy [b, B+1],
  greedy[:, i] the AR prediction for the slot of drafts[:, i] (the last one is the bonus).
  a = leading run of i < n_drafts with drafts[:, i] == greedy[:, i]; the committed tokens
  are greedy[:, :a+1] (the kept drafts equal their predictions), so commit = a + 1."""
  slot = jnp.arange(drafts.shape[1])[None]
  ok = (drafts == greedy[:, :-1]) & (slot < n_drafts[:, None])
  kept = jnp.sum(jnp.cumprod(ok.astype(jnp.int32), axis=1), axis=1)
  return kept + 1, kept == n_drafts


@decode_loop("block", "max_new_tokens", "window")
def _generate(graphdef, state, tokens, positions, segments, lengths, stop_ids, pad_id,
              mask_id, block: int, max_new_tokens: int, window: str):
  model = nnx.merge(graphdef, state)
  b, width = tokens.shape
  # A live row's index is width - 1 + its tokens so far (< max_new); a window is 1 + 2B.
  cache = KVCache.create(model.cfg, b, width + max_new_tokens + 2 * block)
  _, cache = model.forward_cached(tokens[:, :-1], cache, positions=positions[:, :-1],
                                  segment_ids=segments[:, :-1])
  cache = cache.per_row()
  slot = jnp.arange(block)[None]
  verified = jnp.arange(block + 1)[None]
  rows = jnp.arange(b)[:, None]
  masks = jnp.full((b, block), mask_id, jnp.int32)
  ones = jnp.ones((b, 1), jnp.int32)

  def wide(cache, pending, drafts, n_drafts, committed):
    """[p | d_1..d_B (n_drafts valid) | M_1..M_B]: (argmax [b, 1 + 2B], cache)."""
    valid = slot < n_drafts[:, None]
    window = jnp.concatenate([pending[:, None], jnp.where(valid, drafts, pad_id), masks], 1)
    c = committed[:, None]  # tokens so far, p included: p sits at position c - 1
    pos = jnp.concatenate([c - 1, jnp.where(valid, c + slot, 0), c + n_drafts[:, None] + slot],
                          axis=1)
    seg = jnp.concatenate([ones, valid.astype(jnp.int32), jnp.ones_like(masks)], axis=1)
    logits, cache = model.forward_cached(window, cache, positions=pos, segment_ids=seg)
    return jnp.argmax(logits, axis=-1).astype(jnp.int32), cache

  def narrow(cache, pending, drafts, n_drafts, committed):
    """[p | M_1..M_B] when no row has drafts: the same outputs at p and the masks, laid out
    as `wide`'s (the draft slots' outputs are never read without drafts)."""
    c = committed[:, None]
    window = jnp.concatenate([pending[:, None], masks], 1)
    pos = jnp.concatenate([c - 1, c + slot], axis=1)
    logits, cache = model.forward_cached(window, cache, positions=pos,
                                         segment_ids=jnp.ones_like(window))
    guesses = jnp.argmax(logits, axis=-1).astype(jnp.int32)
    return jnp.concatenate([guesses[:, :1], masks, guesses[:, 1:]], axis=1), cache

  def live(carry):
    return ~jnp.all(carry[6])

  def step(forward):
    """The loop body around `forward` (wide or narrow)."""
    def body(carry):
      cache, pending, drafts, n_drafts, committed, out, done, count, forwards = carry
      forwards = forwards + (~done).astype(jnp.int32)  # per row: the forwards it was live in
      start = cache.index
      guesses, cache = forward(cache, pending, drafts, n_drafts, committed)
      greedy, next_drafts = guesses[:, :block + 1], guesses[:, block + 1:]
      commit, all_kept = accept_drafts(drafts, n_drafts, greedy)
      # The cache keeps p and the kept drafts: the row's next window starts after them.
      cache = dataclasses.replace(cache, index=start + jnp.where(done, 0, commit))
      # Output: clip at the first stop token and at the budget; done rows take nothing.
      is_stop = jnp.isin(greedy, stop_ids) & (verified < commit[:, None])
      first_stop = jnp.where(jnp.any(is_stop, axis=1), jnp.argmax(is_stop, axis=1) + 1,
                             block + 1)
      k = jnp.minimum(jnp.minimum(commit, first_stop), max_new_tokens - count)
      k = jnp.where(done, 0, k)
      take = verified < k[:, None]
      at = jnp.where(take, count[:, None] + verified, max_new_tokens)  # out of range: dropped
      out = out.at[rows, at].set(greedy, mode="drop")
      # Done rows stand still (their positions must not run past the model's context).
      committed = committed + jnp.where(done, 0, commit)
      done = done | jnp.any(is_stop & take, axis=1) | (count + k >= max_new_tokens)
      pending = jnp.take_along_axis(greedy, (commit - 1)[:, None], axis=1)[:, 0]
      # Done rows draft nothing, so they never keep the batch on the wide window.
      n_drafts = jnp.where(all_kept & ~done, block, 0)
      return (cache, pending, next_drafts, n_drafts, committed, out, done, count + k,
              forwards)
    return body

  def drafting(carry):
    return jnp.any(carry[3] > 0)

  def sweep(carry):
    # A while loop per window, in turn, not a lax.cond: a conditional copied the whole KV
    # cache every forward (its branches cannot update the loop-carried buffers in place).
    carry = jax.lax.while_loop(lambda c: live(c) & ~drafting(c), step(narrow), carry)
    carry = jax.lax.while_loop(lambda c: live(c) & drafting(c), step(wide), carry)
    # Stale scratch must not stay visible (module docstring): a window starts at or after
    # the last one's start and, as wide, overwrites all its scratch; only the narrow
    # windows after the wide ones would leave some of it, so it is forgotten here once.
    return (carry[0].forget_scratch(1 + 2 * block),) + carry[1:]

  carry = (cache, tokens[:, -1], jnp.full((b, block), pad_id, jnp.int32),
           jnp.zeros((b,), jnp.int32), lengths, jnp.full((b, max_new_tokens), pad_id, jnp.int32),
           jnp.zeros((b,), bool), jnp.zeros((b,), jnp.int32), jnp.zeros((b,), jnp.int32))
  carry = jax.lax.while_loop(live, step(wide) if window == "full" else sweep, carry)
  return carry[5], carry[7], carry[8]


def generate(model, prompts, max_new_tokens: int, block: int, mask_id: int, stop_ids=(),
             pad_id: int = 0, window: str = "fit", bucket: int | None = None) -> Generation:
  """Lossless MARS decoding of a batch of token-id prompts: the tokens of AR greedy, with
  up to block + 1 of them per forward when the model's mask drafts are right. `window`:
  "fit" reads [p | masks] when no row has drafts, "full" always [p | drafts | masks].
  `bucket`: the prompt width bucket (default prompts.BUCKET)."""
  if block < 1:
    raise CardjaxError(f"block={block} must be >= 1")
  if mask_id < 0:
    raise CardjaxError("MARS decoding needs the model's [MASK] id (model.mask_token_id)")
  if window not in WINDOWS:
    raise CardjaxError(f"window={window!r} is not a window width; use one of {WINDOWS}")
  return decode(_generate, model, prompts, max_new_tokens + 2 * block, stop_ids, pad_id,
                np.int32(mask_id), bucket=bucket, block=block, max_new_tokens=max_new_tokens,
                window=window)
