"""MARS (METHODS.md section 2) against its plain-numpy rendering and separate forwards."""

from __future__ import annotations

import numpy as np
import pytest

import objectives_reference as ref
from objectives_helpers import (MASK, objective, make_batch, np_batch, jitted, run,
                               random_logits, small_model, forward)
from cardjax.attention import MaskSpec, dense_mask


@pytest.fixture(scope="module")
def model():
  return small_model()


# === MARS ====================================================================================

B_MARS = 4
# Row 0: prompt 5 + response 6, EOS-padded to 12 (a multiple of B) then padding to 16.
# Row 1: two packed SFT documents (prompt 3 + response 5, prompt 2 + response 6).
# Row 2: a pretraining-like row (all tokens carry loss).
MARS_ROWS = [[(5, 7)], [(3, 5), (2, 6)], [(0, 16)]]


def test_mars_attention_equals_rules():
  obj = objective("mars", block_size=B_MARS)
  batch = make_batch(MARS_ROWS, 16)
  nb = np_batch(batch)
  inputs = run(obj, batch, 0)
  assert inputs.mask == MaskSpec("dual_stream", B_MARS)
  meta = (inputs.positions, inputs.streams, inputs.segment_ids)
  got = np.asarray(dense_mask(inputs.mask, meta, meta))
  for r in range(len(MARS_ROWS)):
    want = ref.two_stream_mask(ref.mars_rule, nb["positions"][r], nb["segment_ids"][r],
                               B_MARS, noisy_first=False)
    bad = np.argwhere(got[r] != want)
    assert not len(bad), f"row {r}: (query, key) {bad[:5].tolist()}"


def test_mars_streams():
  obj = objective("mars", block_size=B_MARS)
  batch = make_batch(MARS_ROWS, 16)
  nb = np_batch(batch)
  inputs = run(obj, batch, 0)
  tok, l = np.asarray(inputs.tokens), 16
  assert tok.shape == (3, 32) and obj.stream_factor == 2
  np.testing.assert_array_equal(tok[:, :l], nb["tokens"])
  response = (nb["loss_mask"] > 0) & (nb["segment_ids"] > 0)
  np.testing.assert_array_equal(tok[:, l:] == MASK, response)  # [MASK] exactly on responses
  np.testing.assert_array_equal(tok[:, l:][~response], nb["tokens"][~response])
  np.testing.assert_array_equal(np.asarray(inputs.streams), [[0] * l + [1] * l] * 3)
  for key, arr in (("positions", inputs.positions), ("segment_ids", inputs.segment_ids)):
    np.testing.assert_array_equal(np.asarray(arr), np.concatenate([nb[key]] * 2, axis=1))
  # Unused rng: MARS is deterministic.
  again = run(obj, batch, 1)
  np.testing.assert_array_equal(np.asarray(again.tokens), tok)


@pytest.mark.parametrize("alpha", [1.0, 0.3])
def test_mars_loss_equals_numpy(alpha):
  obj = objective("mars", block_size=B_MARS, alpha=alpha)
  batch = make_batch(MARS_ROWS, 16)
  nb = np_batch(batch)
  inputs = run(obj, batch, 0)
  logits = random_logits((3, 32), seed=1)
  loss, metrics = jitted(obj)[1](logits, inputs)
  want, noisy, clean = ref.mars_loss(np.asarray(logits), nb["tokens"], nb["segment_ids"],
                                     nb["loss_mask"], alpha)
  np.testing.assert_allclose(float(loss), want, rtol=1e-5)
  np.testing.assert_allclose(float(metrics["mars/noisy"]), noisy, rtol=1e-5)
  np.testing.assert_allclose(float(metrics["mars/clean"]), clean, rtol=1e-5)
  assert float(metrics["loss/mars"]) == float(loss)



def test_mars_forward_equals_separate_causal_forwards(model):
  """One row, prompt 3 + response 13 (L = 16, B = 4): the clean stream equals a causal
  forward of the clean tokens; noisy block k equals a causal forward of (clean blocks < k,
  noisy block k) at positions 0..(k+1)B-1. All the block forwards run as one batch, row k
  holding that sequence (anything after it is invisible to a causal forward), row 0 the
  clean row."""
  l, blk = 16, B_MARS
  obj = objective("mars", block_size=blk)
  batch = make_batch([[(3, 13)]], l, seed=5)
  inputs = run(obj, batch, 0)
  dual = forward(model, inputs.tokens, inputs.positions, inputs.segment_ids, inputs.streams,
                 inputs.mask)[0]
  clean, noisy = np.asarray(inputs.tokens)[0, :l], np.asarray(inputs.tokens)[0, l:]
  nblk = l // blk
  rows = np.stack([clean] + [np.concatenate([clean[:k * blk], noisy[k * blk:]])
                             for k in range(nblk)])
  sep = forward(model, rows, np.repeat(np.arange(l)[None], nblk + 1, 0),
                np.ones((nblk + 1, l)), np.zeros((nblk + 1, l)), MaskSpec("causal"))
  np.testing.assert_allclose(dual[:l], sep[0], atol=1e-5)  # clean stream = plain causal
  for k in range(nblk):
    sl = slice(k * blk, (k + 1) * blk)
    np.testing.assert_allclose(dual[l:][sl], sep[k + 1, sl], atol=1e-5, err_msg=f"block {k}")
