"""Measure decoders side by side: speed (tokens per forward, tokens/s) and quality.

Used by benchmarks/decode.py, the demo's decode stage and `cardjax eval`, so all report
the same numbers:
- arithmetic: exact match of "The answer is N." on the arith_sft test split;
- code: the NLL of the generated continuation under an AR model (the judge), since there is
  no reference answer for free-running code.
The prompt sets come from eval/inputs.py. Timing excludes compilation: every distinct
batch shape is decoded once before the clock starts (prompts are left-padded to multiples
of 16, so a few shapes cover a prompt set).
"""

from __future__ import annotations

import dataclasses
import statistics
import time
from typing import Callable, Sequence

import jax.numpy as jnp
import numpy as np
import optax
from flax import nnx

from cardjax.data import arith
from cardjax.decoding.prompts import padded_width


@dataclasses.dataclass
class Run:
  """One decoder over a prompt set at one batch size."""
  rows: list[list[int]]
  forwards: int  # batched forwards summed over batches
  repeat_seconds: list[float]  # one pass over the prompt set, per timed repeat
  batch: int
  row_forwards: int  # sum over rows of the forwards the row was live (still generating) in
  batch_row_forwards: int = 0  # sum over batches of forwards x rows in the batch

  @property
  def tokens(self) -> int:
    return sum(len(r) for r in self.rows)

  @property
  def tokens_per_forward(self) -> float:
    """Generated tokens per forward of a row while it generates: AR reads 1.00 at any
    batch size (a row that stopped and waits for the batch's others is not counted)."""
    return self.tokens / max(1, self.row_forwards)

  @property
  def batch_fill(self) -> float:
    """The share of a batch's row-forwards that went to rows still generating: the rest
    are stopped rows riding along, which a batched call pays for."""
    return self.row_forwards / max(1, self.batch_row_forwards or self.row_forwards)

  @property
  def seconds(self) -> float:
    """The median pass: a shared VM's stalls hit single repeats, both ways."""
    return statistics.median(self.repeat_seconds)

  @property
  def tokens_per_second(self) -> float:
    return self.tokens / max(self.seconds, 1e-9)

  @property
  def tokens_per_second_range(self) -> tuple[float, float]:
    """(slowest, fastest) repeat: the spread a second run of the same command lands in."""
    return (self.tokens / max(max(self.repeat_seconds), 1e-9),
            self.tokens / max(min(self.repeat_seconds), 1e-9))


def exact_match(rows: Sequence[Sequence[int]], answers: Sequence[str], tokenizer) -> float:
  """The share of rows whose decoded text ends in the right "The answer is N." (arith)."""
  graded = [arith.grade(tokenizer.decode(r, skip_special=True), a) for r, a in zip(rows, answers)]
  return float(np.mean(graded))


def warm_up(decode: Callable, prompts: Sequence[Sequence[int]], batch: int) -> list[list]:
  """The prompts in chunks of `batch`, after decoding one chunk of each compiled shape
  (rows, padded width), so a timing that follows measures no compile. The width bucket is
  the decoder's (make_decoder's `decode.bucket`), else prompts.BUCKET."""
  chunks = [list(prompts[i:i + batch]) for i in range(0, len(prompts), batch)]
  bucket = getattr(decode, "bucket", None)
  seen = set()
  for chunk in chunks:
    key = (len(chunk), padded_width(chunk, bucket))
    if key not in seen:
      seen.add(key)
      decode(chunk)
  return chunks


def one_pass(decode: Callable, chunks: Sequence[list],
             progress=None) -> tuple[list[list[int]], int, int, int]:
  """(rows, batched forwards, live row-forwards, batch row-forwards) of decoding every
  chunk once (warm_up's chunks): a row-forward is live while its row still generates, and
  a batch's row-forwards are its forwards x its rows. `progress` (a tqdm bar, counted in
  prompts) is advanced after each chunk."""
  rows, forwards, row_forwards, batch_row_forwards = [], 0, 0, 0
  for chunk in chunks:
    out = decode(chunk)
    rows += out.rows()
    forwards += out.forwards
    row_forwards += int(out.row_forwards.sum())
    batch_row_forwards += out.forwards * len(chunk)
    if progress is not None:
      progress.update(len(chunk))
  return rows, forwards, row_forwards, batch_row_forwards


def timed(decode: Callable, prompts: Sequence[Sequence[int]], batch: int,
          repeats: int = 1, min_seconds: float = 0.0) -> Run:
  """Decode `prompts` in batches of `batch` with decode(chunk) -> Generation; compile first,
  then time the whole set `repeats` times, keeping every repeat (tokens/s is their median,
  with their range). A timing shorter than min_seconds decodes the set again (same tokens)
  until it is not, and is divided by the passes: a 2-core VM on a shared host varies by tens
  of percent over a fraction of a second. Every pass must decode the same tokens: a decoder
  that does not is a bug, not noise."""
  chunks = warm_up(decode, prompts, batch)
  first, seconds = None, []
  for _ in range(repeats):
    passed, first = _passes(decode, chunks, min_seconds, first)
    seconds.append(passed)
  return Run(first[0], first[1], seconds, batch, first[2], first[3])


def timed_against(decode: Callable, base: Callable, prompts: Sequence[Sequence[int]],
                  batch: int, repeats: int = 1, min_seconds: float = 0.0
                  ) -> tuple[Run, list[float]]:
  """`timed` for decode, with `base` (the AR reference) timed in the same rounds: each
  round times base over the prompt set, then decode. Returns decode's Run and each round's
  speedup, (decode's tokens/s) / (base's tokens/s). A shared VM's speed drifts by tens of
  percent over minutes, so the ratio of two timings taken minutes apart (two rows of a
  table) moves with it, while a ratio inside one round, seconds apart, moves much less."""
  chunks, base_chunks = warm_up(decode, prompts, batch), warm_up(base, prompts, batch)
  first, base_first, seconds, speedups = None, None, [], []
  for _ in range(repeats):
    base_seconds, base_first = _passes(base, base_chunks, min_seconds, base_first)
    passed, first = _passes(decode, chunks, min_seconds, first)
    seconds.append(passed)
    tokens, base_tokens = (sum(len(r) for r in got[0]) for got in (first, base_first))
    speedups.append((tokens / passed) / (base_tokens / base_seconds))
  return Run(first[0], first[1], seconds, batch, first[2], first[3]), speedups


def _passes(decode: Callable, chunks, min_seconds: float, first):
  """(seconds per pass, first) of decoding the chunks until min_seconds have passed (at
  least once); `first` is the first pass's one_pass(), set on the
  first call, and every later pass must decode the same tokens: a decoder that does not
  is a bug, not noise."""
  passes, start = 0, time.perf_counter()
  while passes == 0 or time.perf_counter() - start < min_seconds:
    got = one_pass(decode, chunks)
    if first is None:
      first = got
    elif got[0] != first[0]:
      raise RuntimeError("a repeat decoded different tokens: the decoder is not "
                         "deterministic")
    passes += 1
  return (time.perf_counter() - start) / passes, first


def judge_nll(model, prompts, rows, batch: int = 16) -> float:
  """Mean NLL per generated token under `model` (an AR judge), prompts as context."""
  total, count = 0.0, 0
  width = max(len(p) + len(r) for p, r in zip(prompts, rows))
  width = -(-width // 16) * 16
  score = nnx.jit(_score)
  for i in range(0, len(prompts), batch):
    tokens = np.zeros((batch, width), np.int32)
    segments = np.zeros((batch, width), np.int32)
    weights = np.zeros((batch, width), np.float32)
    for j, (p, r) in enumerate(zip(prompts[i:i + batch], rows[i:i + batch])):
      seq = list(p) + list(r)
      tokens[j, :len(seq)] = seq
      segments[j, :len(seq)] = 1
      weights[j, len(p):len(seq)] = 1.0  # targets: the generated tokens
    nll = score(model, jnp.asarray(tokens), jnp.asarray(segments))
    total += float((np.asarray(nll) * weights[:, 1:]).sum())
    count += int(weights.sum())
  return total / max(count, 1)


def _score(model, tokens, segments):
  positions = jnp.broadcast_to(jnp.arange(tokens.shape[1]), tokens.shape)
  logits = model(tokens, positions=positions, segment_ids=segments)
  return optax.softmax_cross_entropy_with_integer_labels(
      logits[:, :-1].astype(jnp.float32), tokens[:, 1:])
