"""Log-likelihoods of MDLM (masked diffusion) checkpoints: a Monte Carlo estimate of the
ELBO, the bound their training maximizes, for lm-eval's loglikelihood requests.

A masked diffusion model has no AR-order factorization to sum. For a continuation of L
tokens after a context, each draw picks l uniformly from 1..L and l of the continuation's
positions uniformly, replaces them by [MASK], reads the sequence under the bidirectional
mask and scores

    (L / l) * sum over the masked positions of log p(token | the unmasked sequence)

(LLaDA's estimator: its mean over draws is the ELBO, a lower bound on the log-likelihood,
with lower variance than drawing a mask rate t). The estimate is the mean of `draws`
draws; their randomness is seeded by the sequence's own ids, so a request scores the same
whatever it is batched with. `greedy` is read from one more row with the whole
continuation masked: every token the argmax there. A Dream-style checkpoint
(objective.shift) predicts position q from the output at q - 1.

Rows are right-padded (segment 0: no real token attends to the padding) to loglik.py's
bucket widths, batch_size rows a forward.
"""

from __future__ import annotations

import functools
import time
import zlib
from typing import Sequence

import numpy as np

from cardjax.errors import CardjaxError
from cardjax.eval.harness.loglik import bucket_width


def _elbo_fn(graphdef, state, tokens, segments, targets, weights):
  import jax
  import jax.numpy as jnp
  from flax import nnx

  from cardjax.attention import BIDIRECTIONAL

  logits = nnx.merge(graphdef, state)(tokens, segment_ids=segments, mask=BIDIRECTIONAL)
  logp = jax.nn.log_softmax(logits.astype(jnp.float32), axis=-1)
  chosen = jnp.take_along_axis(logp, targets[..., None], axis=-1)[..., 0]
  hit = jnp.argmax(logp, axis=-1) == targets
  return (chosen * weights).sum(-1), jnp.all(hit | (weights == 0), axis=-1)


@functools.cache
def _loop():
  from cardjax.decoding.frozen import DecodeLoop
  return DecodeLoop(_elbo_fn, ())


def _rows(seq: list[int], k: int, draws: int, mask_id: int, shift: bool, seed: int):
  """[(input ids, target position -> id, L / l)] of each draw, then the all-masked row
  (weight 0: it only reads greedy). The continuation is the last k of `seq`."""
  n = len(seq)
  cont = np.arange(n - k, n)
  rng = np.random.default_rng([seed, zlib.crc32(np.asarray(seq, np.int64).tobytes())])
  out = []
  for d in range(draws + 1):
    if d < draws:
      l = int(rng.integers(1, k + 1))
      masked = rng.permutation(cont)[:l]
      scale = k / l
    else:
      masked, scale = cont, 0.0
    ids = np.asarray(seq, np.int32)
    ids[masked] = mask_id
    # shift: the output at q - 1 predicts q (the context is never empty: q - 1 exists).
    out.append((ids, {int(q) - int(shift): seq[q] for q in masked}, scale))
  return out


def score(frozen, pairs: Sequence[tuple[Sequence[int], Sequence[int]]], max_length: int,
          batch_size: int, pad_id: int, mask_id: int, shift: bool, draws: int, seed: int,
          cost, progress=None) -> list[tuple[float, bool]]:
  """[(ELBO estimate of the continuation's log-likelihood, greedy)] of each (context,
  continuation) pair, in order; what it cost is added to `cost` (a metrics.Scored)."""
  if draws < 1:
    raise CardjaxError(f"elbo_draws={draws} must be >= 1 (Monte Carlo mask draws per "
                       "request; LLaDA evaluates with 128)")
  if mask_id < 0:
    raise CardjaxError("this checkpoint has no [MASK] id (model.mask_token_id), which the "
                       "ELBO of a masked diffusion model needs")
  rows = []
  for context, continuation in pairs:
    if not continuation:
      raise CardjaxError("a loglikelihood request has an empty continuation (nothing to "
                         "score); give the task's choices / targets some text")
    seq = (list(context) + list(continuation))[-max_length:]
    k = min(len(continuation), len(seq) - 1)  # a context token stays visible
    rows += _rows(seq, k, draws, mask_id, shift, seed)
  sums, greedy = np.zeros(len(rows)), np.zeros(len(rows), bool)
  order = sorted(range(len(rows)), key=lambda r: -len(rows[r][0]))
  for start in range(0, len(order), batch_size):
    chunk = order[start:start + batch_size]
    width = bucket_width(max(len(rows[r][0]) for r in chunk), max_length)
    tokens = np.full((batch_size, width), pad_id, np.int32)
    segments = np.zeros((batch_size, width), np.int32)
    targets = np.zeros((batch_size, width), np.int32)
    weights = np.zeros((batch_size, width), np.float32)
    for j, r in enumerate(chunk):
      ids, wanted, _ = rows[r]
      tokens[j, :len(ids)], segments[j, :len(ids)] = ids, 1
      for q, t in wanted.items():
        targets[j, q], weights[j, q] = t, 1.0
      cost.tokens += len(ids)
    begin = time.perf_counter()
    got, hit = frozen.compiled(_loop())(tokens, segments, targets, weights)
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
    estimate = sum(rows[r][2] * sums[r] for r in range(first, first + draws)) / draws
    out.append((float(estimate), bool(greedy[first + draws])))
  return out
