"""Semi-autoregressive block decoding of bidirectional MDLM models (METHODS.md section 4).

The sequence is [prompt | G x MASK], G = max_new_tokens rounded up to a multiple of the
block B. Blocks are filled left to right; each forward is a full bidirectional forward over
the whole sequence (every position sees the masks, so there is no KV cache to reuse), and a
planner (`planners.py`) reveals some masked slots of the current block. shift=False (LLaDA
style): slot k's distribution is the output at slot k; shift=True (Dream style,
right-shifted logits): the output at slot k-1.

Left-padded prompts: padding has segment 0 and the bidirectional mask never crosses
segments, so a row decodes exactly as it would alone. Rows fill each block in lockstep (a
row done with it waits unchanged). Slots past max_new_tokens in the last block stay [MASK]
(never revealed: they are not part of the answer). Stops: once a block is full, a row with
a stop token in it is done (its later blocks stay masks) and its output ends at its first
stop token; the loop ends when every row is done. `forwards` counts every model call.
"""

from __future__ import annotations

from typing import NamedTuple

import jax
import jax.numpy as jnp
import numpy as np
from flax import nnx

from cardjax.attention import BIDIRECTIONAL
from cardjax.decoding import blocks, planners
from cardjax.decoding.frozen import decode_loop
from cardjax.decoding.prompts import Generation
from cardjax.decoding.reference import full_logits


class _Carry(NamedTuple):
  seq: jax.Array  # [b, width + G]: the prompt, placed tokens, [MASK] elsewhere
  blk: jax.Array
  rnd: jax.Array
  masked: jax.Array  # [b, B] slots of the block still to reveal
  done: jax.Array  # [b]
  forwards: jax.Array  # [b] the forwards each row was live (not done) in


@decode_loop("planner", "max_new_tokens", "shift")
def _generate(graphdef, state, tokens, positions, segments, lengths, stop_ids, pad_id,
              mask_id, knobs, steps, planner: planners.Planner, max_new_tokens: int,
              shift: bool):
  model = nnx.merge(graphdef, state)
  b, width = tokens.shape
  size = planner.block
  blocks = -(-max_new_tokens // size)
  gen = jnp.arange(blocks * size)[None]
  seq = jnp.concatenate([tokens, jnp.full((b, blocks * size), mask_id, jnp.int32)], axis=1)
  pos = jnp.concatenate([positions, lengths[:, None] + gen], axis=1)
  seg = jnp.concatenate([segments, jnp.ones((b, blocks * size), jnp.int32)], axis=1)
  slot = jnp.arange(size)[None]

  def todo(blk, done):
    return (blk * size + slot < max_new_tokens) & ~done[:, None]

  def cond(c: _Carry):
    return (c.blk < blocks) & ~jnp.all(c.done)

  def body(c: _Carry):
    logits = model(c.seq, positions=pos, segment_ids=seg, mask=BIDIRECTIONAL)
    start = width + c.blk * size
    slot_logits = jax.lax.dynamic_slice_in_dim(logits, start - int(shift), size, axis=1)
    guess, show = planners.plan_step(planner, slot_logits, c.masked, c.rnd, knobs,
                                     c.rnd >= steps - 1)
    block = jnp.where(show, guess, jax.lax.dynamic_slice_in_dim(c.seq, start, size, axis=1))
    seq = jax.lax.dynamic_update_slice_in_dim(c.seq, block, start, axis=1)
    masked = c.masked & ~show
    full = ~jnp.any(masked)  # the whole batch moves to the next block together
    kept = todo(c.blk, c.done)
    done = c.done | (full & jnp.any(jnp.isin(block, stop_ids) & kept, axis=1))
    blk = c.blk + full.astype(jnp.int32)
    return _Carry(seq, blk, jnp.where(full, 0, c.rnd + 1),
                  jnp.where(full, todo(blk, done), masked), done,
                  c.forwards + (~c.done).astype(jnp.int32))

  done = jnp.zeros((b,), bool)
  c = jax.lax.while_loop(cond, body, _Carry(seq, jnp.int32(0), jnp.int32(0), todo(0, done),
                                            done, jnp.zeros((b,), jnp.int32)))
  out = c.seq[:, width:width + max_new_tokens]
  out, count = planners.cut_at_stop(out, c.done, stop_ids, pad_id)
  return out, count, c.forwards


def generate(model, prompts, max_new_tokens: int, block: int, planner: str = "dus",
             shift: bool = False, tau: float = 0.9, gamma: float = 1.0, remask: float = 0.0,
             spacing: bool = False, base: int = 2, g0: int = 8, steps: int | None = None,
             mask_id: int | None = None, stop_ids=(), pad_id: int = 0,
             bucket: int | None = None) -> Generation:
  """MDLM block decoding of a batch of token-id prompts (lists of ints), greedy.

  Arguments as `cardjax.decoding.card.generate`, plus shift (False: slot k reads the output
  at k; True: at k-1). `forwards` counts full-sequence forwards (DUS: blocks * log2 B
  with no stop)."""
  return blocks.run(_generate, model, prompts, max_new_tokens, block, planner, tau, gamma,
                    remask, spacing, base, g0, steps, mask_id, stop_ids, pad_id, bucket,
                    shift=bool(shift))


def mdlm_by_recompute(model, prompt, max_new_tokens: int, block: int, planner: str = "dus",
                      shift: bool = False, tau: float = 0.9, gamma: float = 1.0,
                      remask: float = 0.0, spacing: bool = False, base: int = 2,
                      g0: int = 8, steps: int | None = None, mask_id: int | None = None,
                      stop_ids=()) -> tuple[list[int], int]:
  """The reference: one prompt, plain Python, one full bidirectional forward per step.
  Returns (tokens, forwards)."""
  plan = planners.Planner(planner, block, base, spacing)
  knobs = planners.make_knobs(tau, gamma, remask, g0)
  steps = planners.check_steps(steps, block)
  mask_id = planners.check_request(model.cfg.mask_token_id if mask_id is None else mask_id,
                                   model.cfg.vocab_size, max_new_tokens)
  n = len(prompt)
  blocks = -(-max_new_tokens // block)
  seq = list(prompt) + [mask_id] * (blocks * block)
  forwards = 0
  for blk in range(blocks):
    start = n + blk * block
    masked = np.arange(block) < max_new_tokens - blk * block
    rnd = 0
    while masked.any():
      logits = full_logits(model, seq, BIDIRECTIONAL)[None]
      forwards += 1
      guess, show = planners.plan_step(
          plan, logits[:, start - int(shift):start - int(shift) + block],
          jnp.asarray(masked[None]), jnp.int32(rnd), knobs, jnp.bool_(rnd >= steps - 1))
      for k in np.flatnonzero(np.asarray(show)[0]):
        seq[start + k] = int(guess[0, k])
      masked &= ~np.asarray(show)[0]
      rnd += 1
    out = seq[n:min(start + block, n + max_new_tokens)]
    for i, token in enumerate(out):
      if token in stop_ids:
        return out[:i + 1], forwards
  return seq[n:n + max_new_tokens], forwards
