"""Log-likelihoods of token sequences in AR order: lm-eval's loglikelihood and
loglikelihood_rolling requests, once tokenized as its `hf` model tokenizes them.

A request is (context ids, continuation ids). As lm-eval's hf model does, the sequence
context + continuation keeps its last max_length + 1 tokens, the model reads all but the
last, and the continuation's score is the sum of its tokens' log-probabilities given what
precedes them, with `greedy` true when each is the argmax. Rows are right-padded (a causal
model: no real token sees the padding) to one of a few bucket widths and every batch to
batch_size rows, so a task compiles one program per bucket, not one per length.
"""

from __future__ import annotations

import functools
import time
from typing import Sequence

import numpy as np

from cardjax.errors import CardjaxError

SMALLEST = 32  # the narrowest bucket; then doubling up to the model's max length


def buckets(max_length: int) -> list[int]:
  """The padded widths: SMALLEST, doubling, and max_length itself as the last."""
  out, w = [], SMALLEST
  while w < max_length:
    out.append(w)
    w *= 2
  return out + [max_length]


def bucket_width(n: int, max_length: int) -> int:
  return next(w for w in buckets(max_length) if w >= n)


def _score_fn(graphdef, state, inputs, targets):
  import jax
  import jax.numpy as jnp
  from flax import nnx

  logits = nnx.merge(graphdef, state)(inputs).astype(jnp.float32)
  # float32 whatever the compute dtype: sums over hundreds of tokens are compared to 1e-4.
  # The target's logit less the logsumexp, not a gather from a log_softmax: no second
  # (rows, width, vocab) array (3 GB at 8192 x 49k for two rows).
  target = jnp.take_along_axis(logits, targets[..., None], axis=-1)[..., 0]
  chosen = target - jax.nn.logsumexp(logits, axis=-1)
  return chosen, jnp.argmax(logits, axis=-1) == targets


@functools.cache
def _loop():
  """The scoring program as a DecodeLoop: the run's Frozen model compiles it once per width
  with its graphdef closed over (decoding/frozen.py)."""
  from cardjax.decoding.frozen import DecodeLoop
  return DecodeLoop(_score_fn, ())


def score(frozen, pairs: Sequence[tuple[Sequence[int], Sequence[int]]], max_length: int,
          batch_size: int, pad_id: int, cost, progress=None) -> list[tuple[float, bool]]:
  """[(sum of the continuation's log-probs, whether every token is the argmax)] of each
  (context, continuation) pair, in order; what it cost is added to `cost` (a
  metrics.Scored). Longest first, so a batch holds alike lengths (and the first batch
  compiles the widest program)."""
  seqs = []
  for context, continuation in pairs:
    if not continuation:
      raise CardjaxError("a loglikelihood request has an empty continuation (nothing to "
                         "score); give the task's choices / targets some text")
    seqs.append((list(context) + list(continuation))[-(max_length + 1):])
  order = sorted(range(len(seqs)), key=lambda i: -len(seqs[i]))
  out: list = [None] * len(seqs)
  for start in range(0, len(order), batch_size):
    rows = order[start:start + batch_size]
    width = bucket_width(max(len(seqs[i]) - 1 for i in rows), max_length)
    inputs = np.full((batch_size, width), pad_id, np.int32)
    targets = np.full((batch_size, width), pad_id, np.int32)
    for r, i in enumerate(rows):
      s = seqs[i]
      inputs[r, :len(s) - 1] = s[:-1]
      targets[r, :len(s) - 1] = s[1:]
    begin = time.perf_counter()
    chosen, greedy = frozen.compiled(_loop())(inputs, targets)
    chosen, greedy = np.asarray(chosen), np.asarray(greedy)
    cost.seconds += time.perf_counter() - begin
    cost.forwards += 1
    for r, i in enumerate(rows):
      n, k = len(seqs[i]) - 1, len(pairs[i][1])
      k = min(k, n)  # a continuation longer than max_length keeps its scored tail
      out[i] = (float(chosen[r, n - k:n].sum()), bool(greedy[r, n - k:n].all()))
      cost.tokens += n
    if progress is not None:
      progress.update(len(rows))
  return out


def rolling_windows(ids: Sequence[int], prefix_id: int,
                    max_length: int) -> list[tuple[list[int], list[int]]]:
  """(context, continuation) windows covering every token of a document once, as lm-eval's
  hf model cuts them for loglikelihood_rolling: its get_rolling_token_windows with context
  length 1 and make_disjoint_window, so each window scores up to max_length new tokens."""
  from lm_eval import utils

  return [utils.make_disjoint_window(w) for w in utils.get_rolling_token_windows(
      token_list=list(ids), prefix_token=prefix_id, max_seq_len=max_length, context_len=1)]
