"""CARD block decoding with a KV cache (METHODS.md section 1, "Decoding").

The model is causal and right-shifted (the output at q predicts q+1). The generation is
cut into blocks of B slots. A block starts all [MASK]; its first forward reads the window
[pending | block] against the cache, where `pending` are the B committed tokens before the
block (the previous block; padding for the first block, whose prompt was prefilled) and
the block holds the tokens placed so far and [MASK] elsewhere; its later forwards read the
block alone. Slot j's distribution is the output at the token before it: the last pending
token for slot 0 (for the first block the prefill's last output), of which the block's
first forward saves what the planner reads (token, top prob, entropy) for its later ones,
and slot j-1 otherwise. A planner (`planners.py`) then
reveals some masked slots; placed tokens are never re-masked (except DUS's remask option,
which keeps a low-confidence token of a non-final round masked). Since masks are inputs to
later slots and never to earlier ones, any fill order is allowed.

Cache layout: the prompt at [0, width), block i at [width + (i+1)B, width + (i+2)B) and the
padding before block 0 at [width, width + B) (segment 0: never visible). Block i's first
forward writes [pending | block] at [width + iB, width + (i+2)B): the pending half is the
completed block i-1, written for good; the block half is scratch, rewritten by each later
forward of the block (B tokens at width + (i+1)B) and finally by block i+1's first forward,
whose pending half IS the completed block i, so no scratch key outlives its block (keys
past a query's position are causally invisible anyway). So the extra forward that
METHODS.md runs to extend the cache is merged into the next block's first forward and a
block costs exactly its number of rounds (DUS: log2 B forwards for B a power of 2, never
log2 B + 1). The price: the first forward of a block reads 2B tokens instead of B + 1
(the same cost on an accelerator for small B, weight- and cache-bound); later ones read
B; the last block needs no extension at all. Each block's first forward is followed by an
inner while loop of its later ones, so the two window widths never meet in a `lax.cond`
(whose branches XLA gave copies of the whole cache) and the decode stays one jit with
static shapes.

Batches of left-padded prompts fill each block in lockstep: a row whose block is full
waits unchanged until every row's is (MARS's "rows that finish early wait"), so all rows
share the cache index and a row decodes exactly as it would alone. `forwards` counts the
batch's window forwards (per block the most any row needed) after the prompt prefill.
Slots past max_new_tokens in the last block are never revealed (causal: they cannot change
earlier slots). Stops: once a block is full, a row with a stop token in it is done; its
output ends at its first stop token (the rest of that block is discarded).
Step limit: `steps` forwards per block at most; the steps-th reveals every slot left.
"""

from __future__ import annotations

import dataclasses
from typing import NamedTuple

import jax
import jax.numpy as jnp
import numpy as np
from flax import nnx

from cardjax.decoding import blocks, planners
from cardjax.decoding.frozen import decode_loop
from cardjax.decoding.prompts import Generation
from cardjax.decoding.reference import full_logits
from cardjax.model.cache import KVCache


class _Carry(NamedTuple):
  cache: KVCache
  blk: jax.Array  # the block being filled
  rnd: jax.Array  # forwards spent on it so far
  pending: jax.Array  # [b, B] the previous block's tokens
  first: tuple  # slot 0's (token, top prob, entropy), each [b], saved by the block's first
  # forward: three numbers a row, not its logits over the vocabulary
  block: jax.Array  # [b, B] placed tokens, [MASK] elsewhere
  masked: jax.Array  # [b, B] slots still to reveal (within budget, row not done)
  out: jax.Array  # [b, blocks * B]
  done: jax.Array  # [b] a stop token was generated
  forwards: jax.Array  # [b] the forwards each row was live (not done) in


@decode_loop("planner", "max_new_tokens")
def _generate(graphdef, state, tokens, positions, segments, lengths, stop_ids, pad_id,
              mask_id, knobs, steps, planner: planners.Planner, max_new_tokens: int):
  model = nnx.merge(graphdef, state)
  b, width = tokens.shape
  size = planner.block
  blocks = -(-max_new_tokens // size)
  cache = KVCache.create(model.cfg, b, width + (blocks + 1) * size)
  logits, cache = model.forward_cached(tokens, cache, positions=positions,
                                       segment_ids=segments)
  first = tuple(x[:, 0] for x in planners.slot_stats(logits[:, -1:]))  # slot 0 of block 0
  slot = jnp.arange(size)[None]
  ones = jnp.ones((b, size), jnp.int32)
  opening_at = jnp.broadcast_to(jnp.arange(size - 1, 2 * size - 1), (b, size))
  later_at = jnp.broadcast_to(jnp.arange(size - 1), (b, size - 1))

  def todo(blk, done):
    return (blk * size + slot < max_new_tokens) & ~done[:, None]

  def cond(c: _Carry):
    return (c.blk < blocks) & ~jnp.all(c.done)

  def planned(c: _Carry, stats, cache) -> _Carry:
    """One round's reveal from its slots' (token, top prob, entropy), each [b, B]."""
    guess, conf, entropy = stats
    show = planners.reveal(planner, conf, entropy, c.masked, c.rnd, knobs, c.rnd >= steps - 1)
    return c._replace(cache=cache, rnd=c.rnd + 1, first=tuple(x[:, 0] for x in stats),
                      block=jnp.where(show, guess, c.block), masked=c.masked & ~show,
                      forwards=c.forwards + (~c.done).astype(jnp.int32))

  def opening(c: _Carry) -> _Carry:  # [previous block | block]: writes it for good
    start = lengths[:, None] + c.blk * size + slot  # positions of the block's slots
    has_pending = c.blk > 0
    window = jnp.concatenate([c.pending, c.block], axis=1)
    pos = jnp.concatenate([jnp.where(has_pending, start - size, 0), start], axis=1)
    seg = jnp.concatenate([ones * has_pending.astype(jnp.int32), ones], axis=1)
    cache = dataclasses.replace(c.cache, index=width + c.blk * size)
    # The LM head only where a slot's distribution is read: the outputs at the last
    # pending token and the block's first B - 1 slots, B of the window's 2B.
    slot_logits, cache = model.forward_cached(window, cache, positions=pos, segment_ids=seg,
                                              logits_at=opening_at)
    stats = planners.slot_stats(slot_logits)  # block 0's slot 0: the prefill's, saved
    stats = tuple(jnp.concatenate([jnp.where(has_pending, x[:, :1], f[:, None]), x[:, 1:]], 1)
                  for x, f in zip(stats, c.first))
    return planned(c, stats, cache)

  def later(c: _Carry) -> _Carry:  # the block alone, as scratch where the block lives
    start = lengths[:, None] + c.blk * size + slot
    cache = dataclasses.replace(c.cache, index=width + (c.blk + 1) * size)
    logits, cache = model.forward_cached(c.block, cache, positions=start, segment_ids=ones,
                                         logits_at=later_at)  # the last slot's is unread
    stats = tuple(jnp.concatenate([f[:, None], x], 1)
                  for f, x in zip(c.first, planners.slot_stats(logits)))
    return planned(c, stats, cache)

  def body(c: _Carry) -> _Carry:
    # The block's first forward, then its later ones in a loop of their own: no `cond`
    # between the two widths, whose branches each held copies of the whole KV cache in
    # XLA's program (benchmarks/decode_overhead.py measured CARD's loop the costliest).
    c = jax.lax.while_loop(lambda c: jnp.any(c.masked), later, opening(c))
    kept = todo(c.blk, c.done)
    out = jax.lax.dynamic_update_slice(c.out, jnp.where(kept, c.block, pad_id),
                                       (0, c.blk * size))
    done = c.done | jnp.any(jnp.isin(c.block, stop_ids) & kept, axis=1)
    blk = c.blk + 1  # the whole batch moves to the next block together
    return c._replace(blk=blk, rnd=jnp.int32(0), pending=c.block,
                      block=jnp.full((b, size), mask_id, jnp.int32), masked=todo(blk, done),
                      out=out, done=done)

  done = jnp.zeros((b,), bool)
  carry = _Carry(cache, jnp.int32(0), jnp.int32(0), jnp.full((b, size), pad_id, jnp.int32),
                 first,
                 jnp.full((b, size), mask_id, jnp.int32), todo(0, done),
                 jnp.full((b, blocks * size), pad_id, jnp.int32), done,
                 jnp.zeros((b,), jnp.int32))
  c = jax.lax.while_loop(cond, body, carry)
  out, count = planners.cut_at_stop(c.out[:, :max_new_tokens], c.done, stop_ids, pad_id)
  return out, count, c.forwards


def generate(model, prompts, max_new_tokens: int, block: int, planner: str = "confidence",
             tau: float = 0.9, steps: int | None = None, mask_id: int | None = None,
             stop_ids=(), pad_id: int = 0, gamma: float = 1.0, remask: float = 0.0,
             spacing: bool = False, base: int = 2, g0: int = 8,
             bucket: int | None = None) -> Generation:
  """CARD block decoding of a batch of token-id prompts (lists of ints), greedy.

  block: B slots per block; planner: one of planners.KINDS (tau for confidence/cb, gamma
  for eb, remask for dus, spacing + g0 for confidence/cb/eb, base for dus/topk).
  steps: at most this many forwards per block, the last revealing every slot left (None:
  no limit). mask_id: default model.cfg.mask_token_id. `forwards` counts window forwards
  after the prefill (DUS: blocks * log2 B with no stop). bucket: the prompt width bucket
  (default prompts.BUCKET)."""
  return blocks.run(_generate, model, prompts, max_new_tokens, block, planner, tau, gamma,
                    remask, spacing, base, g0, steps, mask_id, stop_ids, pad_id, bucket)


def card_by_recompute(model, prompt, max_new_tokens: int, block: int,
                      planner: str = "confidence", tau: float = 0.9, steps: int | None = None,
                      mask_id: int | None = None, stop_ids=(), gamma: float = 1.0,
                      remask: float = 0.0, spacing: bool = False, base: int = 2,
                      g0: int = 8) -> tuple[list[int], int]:
  """The reference: per step one full causal forward over [prompt | committed | block with
  masks | later blocks all masks], no cache, one prompt, plain Python (the later blocks
  cannot change the outputs that are read: the model is causal). Returns (tokens, forwards)."""
  plan = planners.Planner(planner, block, base, spacing)
  knobs = planners.make_knobs(tau, gamma, remask, g0)
  steps = planners.check_steps(steps, block)
  mask_id = planners.check_request(model.cfg.mask_token_id if mask_id is None else mask_id,
                                   model.cfg.vocab_size, max_new_tokens)
  seq, out, forwards = list(prompt), [], 0
  total = -(-max_new_tokens // block) * block
  for first in range(0, max_new_tokens, block):
    need = min(block, max_new_tokens - first)
    cur = [mask_id] * block
    masked = np.arange(block) < need
    rnd = 0
    while masked.any():
      future = [mask_id] * (len(prompt) + total - len(seq) - block)  # one shape per prompt
      logits = full_logits(model, seq + cur + future)[None, len(seq) - 1:len(seq) - 1 + block]
      forwards += 1
      guess, show = planners.plan_step(plan, logits, jnp.asarray(masked[None]),
                                       jnp.int32(rnd), knobs, jnp.bool_(rnd >= steps - 1))
      show = np.asarray(show)[0]
      cur = [int(g) if s else t for g, s, t in zip(np.asarray(guess)[0], show, cur)]
      masked &= ~show
      rnd += 1
    for token in cur[:need]:
      out.append(token)
      if token in stop_ids:
        return out, forwards
    seq += cur[:need]
  return out, forwards
