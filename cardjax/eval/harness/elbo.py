"""Log-likelihoods of masked diffusion checkpoints: a Monte Carlo estimate of the ELBO, the
bound their training maximizes, for lm-eval's loglikelihood requests. MDLM and BD3LM share
the estimator; they differ in how a draw is read.

A masked diffusion model has no AR-order factorization to sum. For a continuation of L
tokens after a context, each draw picks l uniformly from 1..L and l of the continuation's
positions uniformly, replaces them by [MASK] and scores

    (L / l) * sum over the masked positions of log p(token | the unmasked sequence)

(LLaDA's estimator: its mean over draws is the ELBO, a lower bound on the log-likelihood,
with lower variance than drawing a mask rate t).

- MDLM: the continuation is one group, read in one stream under the bidirectional mask.
- BD3LM: the likelihood factorizes over blocks of B positions aligned from the sequence
  start (objectives/bd3lm.py: block = position // B), each a masked diffusion given the
  clean blocks before it. Every block b holding L_b continuation tokens is its own group
  (l_b drawn from 1..L_b, weight L_b / l_b; context tokens are never masked, so a block
  shared by context and continuation keeps them visible), and the estimate sums over the
  blocks. All blocks of a draw are read in ONE forward of [x_t | x_0] under training's own
  bd3lm mask (bd3lm.stream_inputs): a noisy block sees itself and the clean earlier blocks,
  never a later one, so the blocks' estimates do not interfere.

The estimate is the mean of `draws` draws; their randomness is seeded by the sequence's own
ids, so a request scores the same whatever it is batched with. `greedy` is read from one
more row with every continuation token masked (for BD3LM each block masked whole over clean
earlier blocks): every token the argmax there. A Dream-style checkpoint (objective.shift)
predicts position q from the output at q - 1, as training does.

Rows are right-padded (segment 0: no real token attends to the padding) to loglik.py's
bucket widths, batch_size rows a forward; a BD3LM row is x_t padded to a width w, then x_0
padded alike (2w wide).
"""

from __future__ import annotations

import functools
import time
import zlib
from typing import Sequence

import numpy as np

from cardjax.errors import CardjaxError
from cardjax.eval.harness.loglik import bucket_width


def _weighted_sum(logits, targets, weights):
  """(sum of weight x log p(target) per row, whether every weighted target is the argmax)."""
  import jax
  import jax.numpy as jnp

  logp = jax.nn.log_softmax(logits.astype(jnp.float32), axis=-1)
  chosen = jnp.take_along_axis(logp, targets[..., None], axis=-1)[..., 0]
  hit = jnp.argmax(logp, axis=-1) == targets
  return (chosen * weights).sum(-1), jnp.all(hit | (weights == 0), axis=-1)


def _mdlm_fn(graphdef, state, x_t, segments, targets, weights):
  from flax import nnx

  from cardjax.attention import BIDIRECTIONAL

  logits = nnx.merge(graphdef, state)(x_t, segment_ids=segments, mask=BIDIRECTIONAL)
  return _weighted_sum(logits, targets, weights)


def _bd3lm_fn(graphdef, state, x_t, x_0, positions, segments, targets, weights, block_size):
  from flax import nnx

  from cardjax.model.decoder import head_logits
  from cardjax.objectives.bd3lm import stream_inputs

  model = nnx.merge(graphdef, state)
  inputs = stream_inputs(x_t, x_0, positions, segments, block_size)
  # The head on the noisy stream only: the clean stream's logits are never read.
  logits = head_logits(model.features(**inputs)[:, :x_t.shape[1]], model.head_matrix())
  return _weighted_sum(logits, targets, weights)


@functools.cache
def _loop(blocks: bool):
  from cardjax.decoding.frozen import DecodeLoop
  return DecodeLoop(_bd3lm_fn, ("block_size",)) if blocks else DecodeLoop(_mdlm_fn, ())


def _rows(seq: list[int], k: int, draws: int, block: int | None, mask_id: int, shift: bool,
          seed: int):
  """[(x_t, the clean sequence, target position -> (id, weight))] of each draw, then the
  all-masked row (it only reads greedy). The continuation is the last k of `seq`, in
  groups of one block each (`block` None: one group)."""
  n, clean = len(seq), np.asarray(seq, np.int32)
  cont = np.arange(n - k, n)
  groups = [cont] if block is None else [cont[cont // block == b]
                                         for b in np.unique(cont // block)]
  rng = np.random.default_rng([seed, zlib.crc32(np.asarray(seq, np.int64).tobytes())])
  out = []
  for d in range(draws + 1):
    ids, wanted = clean.copy(), {}
    for positions in groups:
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
          batch_size: int, pad_id: int, mask_id: int, shift: bool, draws: int, seed: int,
          cost, progress=None, block_size: int | None = None) -> list[tuple[float, bool]]:
  """[(ELBO estimate of the continuation's log-likelihood, greedy)] of each (context,
  continuation) pair, in order; what it cost is added to `cost` (a metrics.Scored).
  `block_size` None: an MDLM checkpoint; else a BD3LM one's block size."""
  kind = "a masked diffusion" if block_size is None else "a block diffusion"
  if draws < 1:
    raise CardjaxError(f"elbo_draws={draws} must be >= 1 (Monte Carlo mask draws per "
                       "request; LLaDA evaluates with 128)")
  if mask_id < 0:
    raise CardjaxError("this checkpoint has no [MASK] id (model.mask_token_id), which the "
                       f"ELBO of {kind} model needs")
  if block_size is not None and block_size < 1:
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
      x_t[j, :n], segments[j, :n] = ids, 1
      for q, (t, w) in wanted.items():
        targets[j, q], weights[j, q] = t, w
      if block_size is not None:  # the clean stream, blocks counted from the sequence start
        x_0[j, :n], positions[j, :n] = clean, np.arange(n)
      cost.tokens += n if block_size is None else 2 * n
    begin = time.perf_counter()
    if block_size is None:
      got, hit = frozen.compiled(_loop(False))(x_t, segments, targets, weights)
    else:
      got, hit = frozen.compiled(_loop(True))(x_t, x_0, positions, segments, targets, weights,
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
