"""MARS's compact noisy stream (objective.noisy_fraction < 1): it keeps exactly the blocks
whose outputs carry loss, and its loss and gradients are the full dual stream's, on packed
multi-turn rows with padding on either side; a row that does not fit stops the run with
the share it needed."""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx

from compact_helpers import sft_batch
from objectives_helpers import MASK, MODEL_CFG, objective, small_model
from cardjax.train.periodic import FiniteLoss, TrainingError

B = 4
L = 32
# Per row: (padding before, [documents]); a document is a list of (tokens, carries loss)
# spans: multi-turn chats, a response starting mid-block, one right after a block edge,
# a pretraining-like row, an empty row.
ROWS = [(0, [[(5, False), (7, True)], [(3, False), (4, True), (6, False), (3, True)]]),
        (3, [[(9, False), (8, True)], [(4, False), (5, True)]]),
        (0, [[(8, False), (4, True)]]),
        (4, [[(16, True)]]),
        (L, [])]


def _kept(row: dict) -> list[tuple[int, int]]:
  """(segment, position) of every token of a block that holds a loss-carrying output:
  the numpy rendering of the rule (output q carries loss when q + 1 is a response token
  of the same document)."""
  seg, pos, loss = row["segment_ids"], row["positions"], row["loss_mask"]
  carrying = {(seg[q], pos[q] // B) for q in range(len(seg) - 1)
              if seg[q] > 0 and seg[q + 1] == seg[q] and loss[q + 1]}
  return [(seg[i], pos[i]) for i in range(len(seg)) if (seg[i], pos[i] // B) in carrying]


def _inputs(fraction, batch):
  obj = objective("mars", block_size=B, noisy_fraction=fraction)
  return obj, jax.jit(obj.corrupt)(batch, jax.random.key(0))


def test_the_compact_stream_keeps_the_loss_carrying_blocks():
  batch = sft_batch(ROWS, L)
  nb = {k: np.asarray(v) for k, v in batch.items()}
  obj, inputs = _inputs(0.75, batch)
  slots = obj.noisy_len(L)
  assert slots == 24 and obj.stream_factor == 1.75 and inputs.mask.compact
  tokens, pos, seg = (np.asarray(a)[:, L:] for a in (inputs.tokens, inputs.positions,
                                                     inputs.segment_ids))
  np.testing.assert_array_equal(np.asarray(inputs.tokens)[:, :L], nb["tokens"])
  needed = []
  for r in range(len(ROWS)):
    want = _kept({k: v[r] for k, v in nb.items()})
    needed.append(len(want))
    got = [(s, p) for s, p in zip(seg[r], pos[r]) if s > 0]
    assert got == want, r
    assert (tokens[r, len(want):] == MASK).all() and (seg[r, len(want):] == 0).all()
  np.testing.assert_allclose(np.asarray(inputs.aux["noisy_needed"]), np.array(needed) / L)
  assert max(needed) == 20 and not np.asarray(inputs.aux["noisy_overflow"]).any()


def _loss_and_grads(model, obj, inputs):
  graphdef, params = nnx.split(model, nnx.Param)

  def loss_fn(params):
    m = nnx.merge(graphdef, params)
    logits = m(inputs.tokens, positions=inputs.positions, segment_ids=inputs.segment_ids,
               streams=inputs.streams, mask=inputs.mask)
    return obj.loss(logits, inputs)[0]

  loss, grads = jax.jit(jax.value_and_grad(loss_fn))(params)
  return float(loss), jax.tree.leaves(grads)


@pytest.mark.parametrize("seed", [0, 1])
def test_loss_and_gradients_equal_the_full_stream(seed):
  model = small_model()
  batch = sft_batch(ROWS, L, seed)
  full_loss, full_grads = _loss_and_grads(model, *_inputs(1.0, batch))
  compact_loss, compact_grads = _loss_and_grads(model, *_inputs(0.75, batch))
  assert compact_loss == pytest.approx(full_loss, rel=1e-5)
  for a, b in zip(full_grads, compact_grads):
    np.testing.assert_allclose(np.asarray(b), np.asarray(a), rtol=1e-4, atol=1e-6)


def test_a_row_that_does_not_fit_gives_nan_and_says_so():
  batch = sft_batch(ROWS, L)
  obj, inputs = _inputs(0.5, batch)  # 16 slots; row 0 needs 20
  logits = jnp.zeros(inputs.tokens.shape + (MODEL_CFG.vocab_size,))
  loss, metrics = jax.jit(obj.loss)(logits, inputs)
  assert np.isnan(float(loss)) and float(metrics["mars/noisy_overflow"]) == 1.0
  assert float(metrics["mars/noisy_needed"]) == pytest.approx(20 / L)

  class Checkpoints:
    directory = "run/checkpoints"

    def latest_step(self):
      return 20

  with pytest.raises(TrainingError, match=r"needed 0.625 of the row.*step 20.*noisy_fraction above "
                                          r"0.625"):
    FiniteLoss(Checkpoints())._check(21, dict(metrics, loss=loss), obj)


def test_noisy_fraction_out_of_range_is_a_config_error():
  from cardjax.config import load_config
  from cardjax.errors import ConfigError

  with pytest.raises(ConfigError, match="noisy_fraction=1.5 must be in"):
    load_config("tiny_mars", ["--config.objective.noisy_fraction=1.5"])


def test_structured_attention_serves_the_compact_stream():
  """The structured XLA path (the CPU default) equals the dense reference on every real
  query of a compact row, and its layout check accepts what the objective produces."""
  from cardjax.attention.reference import reference_attention
  from cardjax.attention.structured import layout_problems, structured_attention

  batch = sft_batch(ROWS, L, 2)
  _, inputs = _inputs(0.75, batch)
  meta = tuple(np.asarray(a) for a in (inputs.positions, inputs.streams, inputs.segment_ids))
  assert layout_problems(inputs.mask, meta, meta) == []
  rng = np.random.default_rng(0)
  t = inputs.tokens.shape[1]
  q = jnp.asarray(rng.normal(size=(len(ROWS), t, 4, 8)), jnp.float32)
  k, v = (jnp.asarray(rng.normal(size=(len(ROWS), t, 2, 8)), jnp.float32) for _ in range(2))
  got = np.asarray(structured_attention(q, k, v, inputs.mask, meta, meta))
  want = np.asarray(reference_attention(q, k, v, inputs.mask, meta, meta))
  real = meta[2] > 0
  np.testing.assert_allclose(got[real], want[real], rtol=1e-5, atol=1e-5)
  broken = (meta[0].copy(), meta[1], meta[2])
  broken[0][0, L + 1] += 1  # a position that skips inside a block of the noisy stream
  assert any("noisy stream" in p for p in layout_problems(inputs.mask, broken, broken))


def test_the_step_study_reads_the_share_the_objective_needs():
  from benchmarks.studies.mars_step import needed_share

  batch = sft_batch(ROWS, L)
  _, inputs = _inputs(0.75, batch)
  nb = {k: np.asarray(v) for k, v in batch.items()}
  got = needed_share(nb, B)
  np.testing.assert_allclose(got, np.asarray(inputs.aux["noisy_needed"]))
  np.testing.assert_allclose(got, [len(_kept({k: v[r] for k, v in nb.items()})) / L
                                   for r in range(len(ROWS))])
