"""Log-likelihoods of BD3LM (block diffusion) checkpoints: a Monte Carlo estimate of the
ELBO, elbo.py's estimator applied per block.

BD3LM's likelihood factorizes over blocks of B positions aligned from the sequence start
(objectives/bd3lm.py: block = position // B): each block is a masked diffusion given the
clean blocks before it. For a continuation after a context, every block b holding L_b of
its tokens is one conditional ELBO, estimated as LLaDA's: draw l_b from 1..L_b and l_b of
those positions, mask them in the noisy stream, and score

    sum over blocks of (L_b / l_b) * sum of the masked positions' log p(token)

(context tokens are never masked; a block shared by context and continuation keeps its
context tokens visible). All blocks are drawn at once and read in ONE forward of
[x_t | x_0] under training's own bd3lm mask (bd3lm.stream_inputs): the noisy block sees
itself and the clean earlier blocks, never a later one, so the blocks' estimates do not
interfere. The estimate is the mean of `draws` draws, seeded by the sequence's ids as
elbo.py's; `greedy` is read from one more row with every continuation token masked (each
block masked whole over clean earlier blocks): every token the argmax there. shift (a
Dream-style checkpoint) scores position q at the output of q - 1, as training does.

A row is x_t right-padded to a loglik.py bucket width w, then x_0 padded alike (2w wide).
"""

from __future__ import annotations

import functools
import time
import zlib
from typing import Sequence

import numpy as np

from cardjax.errors import CardjaxError
from cardjax.eval.harness.loglik import bucket_width


def _block_elbo_fn(graphdef, state, x_t, x_0, positions, segments, targets, weights,
                   block_size):
  import jax
  import jax.numpy as jnp
  from flax import nnx

  from cardjax.model.decoder import head_logits
  from cardjax.objectives.bd3lm import stream_inputs

  model = nnx.merge(graphdef, state)
  inputs = stream_inputs(x_t, x_0, positions, segments, block_size)
  # The head on the noisy stream only: the clean stream's logits are never read.
  logits = head_logits(model.features(**inputs)[:, :x_t.shape[1]], model.head_matrix())
  logp = jax.nn.log_softmax(logits.astype(jnp.float32), axis=-1)
  chosen = jnp.take_along_axis(logp, targets[..., None], axis=-1)[..., 0]
  hit = jnp.argmax(logp, axis=-1) == targets
  return (chosen * weights).sum(-1), jnp.all(hit | (weights == 0), axis=-1)


@functools.cache
def _loop():
  from cardjax.decoding.frozen import DecodeLoop
  return DecodeLoop(_block_elbo_fn, ("block_size",))


def _rows(seq: list[int], k: int, draws: int, block: int, mask_id: int, shift: bool,
          seed: int):
  """[(x_t, x_0, target position -> (id, weight))] of each draw, then the all-masked row
  (weights 1: it only reads greedy). The continuation is the last k of `seq`."""
  n, clean = len(seq), np.asarray(seq, np.int32)
  cont = np.arange(n - k, n)
  blocks = [cont[cont // block == b] for b in np.unique(cont // block)]
  rng = np.random.default_rng([seed, zlib.crc32(np.asarray(seq, np.int64).tobytes())])
  out = []
  for d in range(draws + 1):
    ids, wanted = clean.copy(), {}
    for positions in blocks:
      if d < draws:
        l = int(rng.integers(1, len(positions) + 1))
        masked, scale = rng.permutation(positions)[:l], len(positions) / l
      else:
        masked, scale = positions, 1.0
      ids[masked] = mask_id
      # shift: the output at q - 1 predicts q (the context is never empty: q - 1 exists).
      wanted.update({int(q) - int(shift): (seq[q], scale) for q in masked})
    out.append((ids, clean, wanted))
  return out


def score(frozen, pairs: Sequence[tuple[Sequence[int], Sequence[int]]], max_length: int,
          batch_size: int, pad_id: int, mask_id: int, shift: bool, block_size: int,
          draws: int, seed: int, cost, progress=None) -> list[tuple[float, bool]]:
  """[(ELBO estimate of the continuation's log-likelihood, greedy)] of each (context,
  continuation) pair, in order; what it cost is added to `cost` (a metrics.Scored)."""
  if draws < 1:
    raise CardjaxError(f"elbo_draws={draws} must be >= 1 (Monte Carlo mask draws per "
                       "request; LLaDA evaluates with 128)")
  if mask_id < 0:
    raise CardjaxError("this checkpoint has no [MASK] id (model.mask_token_id), which the "
                       "ELBO of a block diffusion model needs")
  if block_size < 1:
    raise CardjaxError(f"block_size={block_size}: a BD3LM checkpoint's ELBO needs the block "
                       "size it trained with (objective.block_size of its run config)")
  rows = []
  for context, continuation in pairs:
    if not continuation:
      raise CardjaxError("a loglikelihood request has an empty continuation (nothing to "
                         "score); give the task's choices / targets some text")
    seq = (list(context) + list(continuation))[-max_length:]
    k = min(len(continuation), len(seq) - 1)  # a context token stays visible
    rows += _rows(seq, k, draws, block_size, mask_id, shift, seed)
  sums, greedy = np.zeros(len(rows)), np.zeros(len(rows), bool)
  order = sorted(range(len(rows)), key=lambda r: -len(rows[r][0]))
  for start in range(0, len(order), batch_size):
    chunk = order[start:start + batch_size]
    width = bucket_width(max(len(rows[r][0]) for r in chunk), max_length)
    x_t = np.full((batch_size, width), pad_id, np.int32)
    x_0 = np.full((batch_size, width), pad_id, np.int32)
    positions = np.zeros((batch_size, width), np.int32)
    segments = np.zeros((batch_size, width), np.int32)
    targets = np.zeros((batch_size, width), np.int32)
    weights = np.zeros((batch_size, width), np.float32)
    for j, r in enumerate(chunk):
      ids, clean, wanted = rows[r]
      n = len(ids)
      x_t[j, :n], x_0[j, :n] = ids, clean
      segments[j, :n], positions[j, :n] = 1, np.arange(n)  # blocks from the sequence start
      for q, (t, w) in wanted.items():
        targets[j, q], weights[j, q] = t, w
      cost.tokens += 2 * n
    begin = time.perf_counter()
    got, hit = frozen.compiled(_loop())(x_t, x_0, positions, segments, targets, weights,
                                        block_size=block_size)
    got, hit = np.asarray(got), np.asarray(hit)
    cost.seconds += time.perf_counter() - begin
    cost.forwards += 1
    for j, r in enumerate(chunk):
      sums[r], greedy[r] = got[j], hit[j]
    if progress is not None:  # whole requests' worth of rows: float steps overrun the bar
      progress.update((start + len(chunk)) // (draws + 1) - start // (draws + 1))
  out = []
  for i in range(len(pairs)):
    first = i * (draws + 1)
    out.append((float(sums[first:first + draws].mean()), bool(greedy[first + draws])))
  return out
