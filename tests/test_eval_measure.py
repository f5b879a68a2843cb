"""The benchmark's measures: judge NLL against a direct computation; run bookkeeping."""

import jax
import numpy as np
import pytest

from cardjax.decoding import generate
from cardjax.eval import measure
from decoding_helpers import tiny_model



def test_judge_nll_is_the_mean_nll_of_the_generated_tokens():
  model = tiny_model()
  prompts = [[5, 9, 2], [1], [60, 61, 62, 7, 7]]
  rows = [[4, 4, 8], [9], [1, 2]]
  total, count = 0.0, 0
  for p, r in zip(prompts, rows):
    seq = np.asarray([p + r])
    logp = jax.nn.log_softmax(np.asarray(model(seq))[0], axis=-1)
    for i in range(len(p), len(seq[0])):
      total -= float(logp[i - 1, seq[0, i]])
      count += 1
  assert abs(measure.judge_nll(model, prompts, rows, batch=2) - total / count) < 1e-5


def test_timed_counts_rows_forwards_and_tokens():
  model = tiny_model()
  prompts = [[5, 9, 2], [1], [60, 61, 62], [8] * 20, [3, 3]]
  run = measure.timed(lambda chunk: generate(model, chunk, 6), prompts, batch=2)
  assert run.rows == generate(model, prompts, 6).rows()
  assert run.tokens == 30 and run.forwards == 3 * 6 and run.row_forwards == 5 * 6
  assert run.tokens_per_forward == 1.0 and run.tokens_per_second > 0


def test_timed_repeats_a_short_set_to_min_seconds():
  """A timing of a short set decodes it again until min_seconds and reports one pass."""
  model = tiny_model()
  prompts = [[5, 9, 2], [1]]
  calls = []

  def decode(chunk):
    calls.append(len(chunk))
    return generate(model, chunk, 4)

  once = measure.timed(decode, prompts, batch=1)
  n_once = len(calls)
  run = measure.timed(decode, prompts, batch=1, min_seconds=0.2)
  assert len(calls) - n_once > 2 * len(prompts) + 2  # warm-up, then more than one pass
  assert run.rows == once.rows and run.forwards == once.forwards
  assert run.seconds < 0.2  # per pass


def test_timed_keeps_every_repeat_and_reports_their_median():
  model = tiny_model()
  prompts = [[5, 9, 2], [1], [7, 7]]
  run = measure.timed(lambda chunk: generate(model, chunk, 4), prompts, batch=2, repeats=3)
  assert len(run.repeat_seconds) == 3
  assert run.seconds == sorted(run.repeat_seconds)[1]
  low, high = run.tokens_per_second_range
  assert low <= run.tokens_per_second <= high
  assert low == run.tokens / max(run.repeat_seconds)


def test_timed_rejects_a_decoder_that_changes_its_tokens():
  model = tiny_model()
  calls = []

  def flaky(chunk):
    calls.append(1)
    return generate(model, chunk, 2 + len(calls) % 2)  # a different length each pass

  with pytest.raises(RuntimeError, match="not deterministic"):
    measure.timed(flaky, [[5, 9, 2]], batch=1, repeats=2)


def test_timed_against_pairs_each_round_with_the_reference():
  """timed_against times base then decode in every round: one speedup per round, each the
  ratio of the two tokens/s of that round, and decode's Run as `timed` gives it."""
  model = tiny_model()
  prompts = [[5, 9, 2], [1], [7, 7]]
  calls = []

  def decode(chunk):
    calls.append("decode")
    return generate(model, chunk, 4)

  def base(chunk):
    calls.append("base")
    return generate(model, chunk, 2)

  run, speedups = measure.timed_against(decode, base, prompts, batch=2, repeats=3)
  assert len(speedups) == 3 and len(run.repeat_seconds) == 3
  assert all(s > 0 for s in speedups)
  assert run.rows == generate(model, prompts, 4).rows()
  timed_calls = calls[-3 * 4:]  # 3 rounds x (2 base chunks + 2 decode chunks)
  assert timed_calls == ["base", "base", "decode", "decode"] * 3
