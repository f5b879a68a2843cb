"""CARD (METHODS.md section 1) against its plain-numpy rendering."""

from __future__ import annotations

import numpy as np
import pytest

import objectives_reference as ref
from objectives_helpers import (MASK, objective, make_batch, np_batch, jitted, run,
                               random_logits, PRETRAIN_ROWS)
from cardjax.attention import MaskSpec


# === CARD ====================================================================================

@pytest.mark.parametrize("masking,lam", [("soft_tail", 1.5), ("strict_tail", 1.5),
                                         ("soft_tail", 2.0)])
def test_card_tail_masks_exactly_n_in_window(masking, lam):
  obj = objective("card", card_masking=masking, card_lambda=lam)
  batch = make_batch(PRETRAIN_ROWS, 32)
  nb = np_batch(batch)
  elig = (nb["loss_mask"] > 0) & (nb["segment_ids"] > 0)
  ns_seen, varied = set(), False
  for seed in range(40):
    inputs = run(obj, batch, seed)
    masked, t = np.asarray(inputs.aux["masked"]).astype(bool), np.asarray(inputs.aux["t"])
    assert (masked <= elig).all()
    for r in range(len(PRETRAIN_ROWS)):
      idx = np.flatnonzero(elig[r])  # the row's real tokens, in order
      n, w = ref.card_n_w(len(idx), float(t[r]), 1.0 if masking == "strict_tail" else lam)
      assert masked[r].sum() == n, (seed, r, t[r])
      window = idx[len(idx) - w:] if w else idx[:0]
      assert set(np.flatnonzero(masked[r])) <= set(window.tolist()), (seed, r)
      if masking == "strict_tail":
        assert set(np.flatnonzero(masked[r])) == set(idx[len(idx) - n:].tolist())
      elif n and set(np.flatnonzero(masked[r])) != set(idx[len(idx) - n:].tolist()):
        varied = True  # the soft tail does not always mask the very last N
      ns_seen.add(n)
  assert 1 in ns_seen and max(ns_seen) > 16
  assert varied or masking == "strict_tail"


def test_card_soft_tail_draws_uniformly_in_window():
  """Fixed t is not possible through the API, so: rows with N masks out of W see each window
  position masked with frequency N/W (pooled over draws by (N, W))."""
  obj = objective("card")
  batch = make_batch([[(0, 16)]] * 64, 16)
  hits = {}
  for seed in range(20):
    inputs = run(obj, batch, seed)
    masked, t = np.asarray(inputs.aux["masked"]), np.asarray(inputs.aux["t"])
    for r in range(64):
      n, w = ref.card_n_w(16, float(t[r]), 1.5)
      if w > n:
        acc = hits.setdefault((n, w), [np.zeros(w), 0])
        acc[0] += masked[r, 16 - w:]
        acc[1] += 1
  checked = 0
  for (n, w), (counts, draws) in hits.items():
    if draws >= 40:
      np.testing.assert_allclose(counts / draws, n / w, atol=4.5 * np.sqrt(0.25 / draws))
      checked += 1
  assert checked >= 2


def test_card_uniform_masking_ratio():
  obj = objective("card", card_masking="uniform")
  batch = make_batch([[(0, 128)]] * 32 + [[(0, 40)]] * 32, 128)
  elig = np_batch(batch)["loss_mask"] > 0
  got, want, early = 0.0, 0.0, 0
  for seed in range(4):
    inputs = run(obj, batch, seed)
    masked, t = np.asarray(inputs.aux["masked"]), np.asarray(inputs.aux["t"])
    assert (masked.astype(bool) <= elig).all()
    got += masked.sum()
    want += (t * elig.sum(1)).sum()
    early += masked[:, :10].sum()
    # per row: |count - t L| within 5 standard deviations of a binomial
    n = elig.sum(1)
    assert (np.abs(masked.sum(1) - t * n) <= 5 * np.sqrt(n * t * (1 - t)) + 1).all()
  assert abs(got / want - 1) < 0.05
  assert early > 0  # uniform masking reaches the start of the row


@pytest.mark.parametrize("beta,p", [(1.0, 0.5), (0.5, 0.2), (2.0, 1.0)])
def test_card_weights_equal_closed_form(beta, p):
  obj = objective("card", card_beta=beta, card_p=p)
  batch = make_batch(PRETRAIN_ROWS, 32)
  nb = np_batch(batch)
  for seed in range(3):
    inputs = run(obj, batch, seed)
    masked = np.asarray(inputs.tokens) == MASK  # the mask as the model sees it
    np.testing.assert_array_equal(masked, np.asarray(inputs.aux["masked"]).astype(bool))
    w = ref.card_weights(masked.astype(int), nb["segment_ids"], beta, p)
    valid = np.array([[ref.next_target(nb["tokens"][r], nb["segment_ids"][r],
                                       nb["loss_mask"][r], q)[1] for q in range(32)]
                      for r in range(len(PRETRAIN_ROWS))])
    np.testing.assert_allclose(np.asarray(inputs.weights), w * valid, rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize("reweighting", ["context", "none"])
@pytest.mark.parametrize("masking", ["soft_tail", "uniform"])
def test_card_loss_equals_numpy(reweighting, masking):
  obj = objective("card", card_reweighting=reweighting, card_masking=masking)
  batch = make_batch(PRETRAIN_ROWS, 32)
  nb = np_batch(batch)
  inputs = run(obj, batch, 7)
  logits = random_logits((len(PRETRAIN_ROWS), 32))
  loss, metrics = jitted(obj)[1](logits, inputs)
  masked = np.asarray(inputs.aux["masked"])
  want = ref.card_loss(np.asarray(logits), nb["tokens"], nb["segment_ids"], nb["loss_mask"],
                       masked, 1.0, 0.5, reweighting)
  np.testing.assert_allclose(float(loss), want, rtol=1e-5)
  assert float(metrics["loss/card"]) == float(loss)
  elig = nb["loss_mask"] > 0
  np.testing.assert_allclose(float(metrics["card/mask_ratio"]), masked.sum() / elig.sum(),
                             rtol=1e-6)
  valid = np.asarray(inputs.aux["valid"]).astype(bool)
  if reweighting == "context":
    w = ref.card_weights(masked, nb["segment_ids"], 1.0, 0.5)
    np.testing.assert_allclose(float(metrics["card/mean_weight"]), w[valid].mean(), rtol=1e-5)
  else:
    assert float(metrics["card/mean_weight"]) == 1.0


def test_card_inputs_and_targets():
  obj = objective("card")
  batch = make_batch(PRETRAIN_ROWS, 32)
  nb = np_batch(batch)
  inputs = run(obj, batch, 3)
  masked = np.asarray(inputs.aux["masked"]).astype(bool)
  assert masked.any()
  tok = np.asarray(inputs.tokens)
  np.testing.assert_array_equal(tok[masked], MASK)
  np.testing.assert_array_equal(tok[~masked], nb["tokens"][~masked])
  assert inputs.mask == MaskSpec("causal") and not np.asarray(inputs.streams).any()
  np.testing.assert_array_equal(np.asarray(inputs.positions), nb["positions"])
  np.testing.assert_array_equal(np.asarray(inputs.segment_ids), nb["segment_ids"])
  targets, weights = np.asarray(inputs.targets), np.asarray(inputs.weights)
  for r in range(len(PRETRAIN_ROWS)):
    for q in range(32):
      target, valid = ref.next_target(nb["tokens"][r], nb["segment_ids"][r],
                                      nb["loss_mask"][r], q)
      assert (weights[r, q] > 0) == valid
      if valid:
        assert targets[r, q] == target  # the CLEAN next token, masked or not


def test_card_clean_fraction():
  batch = make_batch([[(0, 8)]] * 256, 8)
  inputs = run(objective("card", clean_fraction=1.0), batch, 0)
  assert not np.asarray(inputs.aux["masked"]).any()
  assert not (np.asarray(inputs.tokens) == MASK).any()
  inputs = run(objective("card", clean_fraction=0.5), batch, 0)
  clean_rows = ~np.asarray(inputs.aux["masked"]).any(axis=1)  # soft tail masks >= 1 otherwise
  assert 0.4 < clean_rows.mean() < 0.6
  # clean_fraction = 0 (the default) masks every row: test_card_tail_masks_exactly_n_in_window
