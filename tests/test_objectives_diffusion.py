"""MDLM and BD3LM (METHODS.md section 4) against their plain-numpy renderings."""

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


# === MDLM ====================================================================================

DIFF_ROWS = [[(0, 16)], [(4, 12)], [(0, 6), (0, 10)], [(2, 5)], [(0, 1), (0, 9)], []]


def _maskable(nb, shift):
  return ref.maskable(nb["segment_ids"], nb["loss_mask"], shift)


@pytest.mark.parametrize("shift", [False, True])
def test_mdlm_inputs_targets_weights(shift):
  obj = objective("mdlm", shift=shift)
  assert obj.stream_factor == 1
  batch = make_batch(DIFF_ROWS, 16)
  nb = np_batch(batch)
  elig = _maskable(nb, shift)
  for seed in range(5):
    inputs = run(obj, batch, seed)
    assert inputs.mask == MaskSpec("bidirectional")
    masked = np.asarray(inputs.aux["masked"]).astype(bool)
    t = np.asarray(inputs.aux["t"])
    assert (t >= 1e-3).all() and (t < 1).all()
    assert (masked <= elig).all()
    assert (masked.any(1) == elig.any(1)).all()  # at least one mask per row that has any
    tok = np.asarray(inputs.tokens)
    np.testing.assert_array_equal(tok == MASK, masked)
    np.testing.assert_array_equal(tok[~masked], nb["tokens"][~masked])
    targets, weights = np.asarray(inputs.targets), np.asarray(inputs.weights)
    want_w = masked / t[:, None]
    if shift:
      np.testing.assert_array_equal(targets[:, :-1], nb["tokens"][:, 1:])
      np.testing.assert_allclose(weights[:, :-1], want_w[:, 1:], rtol=1e-6)
      assert not weights[:, -1].any() and not masked[:, 0].any()
    else:
      np.testing.assert_array_equal(targets, nb["tokens"])
      np.testing.assert_allclose(weights, want_w, rtol=1e-6)
    np.testing.assert_array_equal(np.asarray(inputs.aux["num_maskable"]), elig.sum(1))


def test_mdlm_mask_ratio_follows_t():
  obj = objective("mdlm")
  batch = make_batch([[(0, 64)]] * 64, 64)
  got = want = 0.0
  for seed in range(3):
    inputs = run(obj, batch, seed)
    masked, t = np.asarray(inputs.aux["masked"]), np.asarray(inputs.aux["t"])
    got += masked.sum()
    want += (64 * t + (1 - t) ** 64).sum()  # + the forced mask of an empty draw (tiny)
  assert abs(got / want - 1) < 0.05


def test_step_strata_cover_the_unit_interval_evenly():
  """frac(u + r / rows): one row per 1/rows stratum, a fresh offset every step, and the
  same values whether the rows are one batch or split (they are indexed globally)."""
  import jax

  from cardjax.train.step import step_strata

  key = jax.random.key(3)
  first = np.asarray(step_strata(key, 0, 16))
  assert ((first >= 0) & (first < 1)).all()
  np.testing.assert_array_equal(np.sort(np.floor(first * 16)), np.arange(16))
  np.testing.assert_allclose(np.diff(np.sort(first)), 1 / 16, atol=1e-6)
  offsets = [float(step_strata(key, s, 16)[0]) for s in range(200)]
  assert len(set(offsets)) == 200 and 0.4 < np.mean(offsets) < 0.6  # each row stays U(0, 1)


@pytest.mark.parametrize("draw", ["independent", "stratified"])
def test_mdlm_t_draw(draw):
  """t_draw=stratified reads the row's stratum (t = t_eps + (1 - t_eps) * stratum); the
  independent draw ignores it; without a stratum (a direct call) both draw from the key."""
  import jax
  import jax.numpy as jnp

  obj = objective("mdlm", t_draw=draw)
  batch = make_batch(DIFF_ROWS, 16)
  strata = jnp.linspace(0.0, 0.9, len(DIFF_ROWS))
  with_strata = jax.jit(obj.corrupt)(dict(batch, stratum=strata), jax.random.key(0))
  plain = run(objective("mdlm"), batch, 0)
  got = np.asarray(with_strata.aux["t"])
  if draw == "stratified":
    np.testing.assert_allclose(got, 1e-3 + (1 - 1e-3) * np.asarray(strata), rtol=1e-6)
  else:
    np.testing.assert_array_equal(got, np.asarray(plain.aux["t"]))
  np.testing.assert_array_equal(np.asarray(run(obj, batch, 0).aux["t"]),
                                np.asarray(plain.aux["t"]))


def test_mdlm_unknown_t_draw_is_refused():
  from cardjax.errors import ConfigError

  with pytest.raises(ConfigError, match="t_draw='sobol'.*stratified"):
    objective("mdlm", t_draw="sobol")


@pytest.mark.parametrize("shift", [False, True])
def test_mdlm_loss_equals_numpy(shift):
  obj = objective("mdlm", shift=shift)
  batch = make_batch(DIFF_ROWS, 16)
  nb = np_batch(batch)
  inputs = run(obj, batch, 11)
  logits = random_logits((len(DIFF_ROWS), 16), seed=2)
  loss, metrics = jitted(obj)[1](logits, inputs)
  masked = np.asarray(inputs.aux["masked"])
  t_pos = np.broadcast_to(np.asarray(inputs.aux["t"])[:, None], masked.shape)
  want = ref.diffusion_loss(np.asarray(logits), nb["tokens"], nb["segment_ids"],
                            nb["loss_mask"], masked, t_pos, shift)
  np.testing.assert_allclose(float(loss), want, rtol=1e-5)
  assert float(metrics["loss/mdlm"]) == float(loss)
  np.testing.assert_allclose(float(metrics["mdlm/mask_ratio"]),
                             masked.sum() / _maskable(nb, shift).sum(), rtol=1e-6)


# === BD3LM ===================================================================================

B_BD = 4


@pytest.mark.parametrize("shift", [False, True])
def test_bd3lm_layout_blocks_and_weights(shift):
  obj = objective("bd3lm", block_size=B_BD, shift=shift)
  assert obj.stream_factor == 2
  batch = make_batch(DIFF_ROWS, 16)
  nb = np_batch(batch)
  elig = _maskable(nb, shift)
  l = 16
  for seed in range(5):
    inputs = run(obj, batch, seed)
    assert inputs.mask == MaskSpec("bd3lm", B_BD)
    tok = np.asarray(inputs.tokens)
    np.testing.assert_array_equal(np.asarray(inputs.streams), [[1] * l + [0] * l] * 6)
    np.testing.assert_array_equal(tok[:, l:], nb["tokens"])  # x_0 second
    for key, arr in (("positions", inputs.positions), ("segment_ids", inputs.segment_ids)):
      np.testing.assert_array_equal(np.asarray(arr), np.concatenate([nb[key]] * 2, axis=1))
    masked = np.asarray(inputs.aux["masked"]).astype(bool)
    t_pos = np.asarray(inputs.aux["t"])
    assert (masked <= elig).all()
    np.testing.assert_array_equal(tok[:, :l] == MASK, masked)
    np.testing.assert_array_equal(tok[:, :l][~masked], nb["tokens"][~masked])
    # t: constant inside each (document, position // B) block, one draw per block.
    for r in range(6):
      blocks = {}
      for i in range(l):
        key = (nb["segment_ids"][r, i], nb["positions"][r, i] // B_BD)
        blocks.setdefault(key, []).append(i)
      ts = []
      for key, idx in blocks.items():
        assert np.all(t_pos[r, idx] == t_pos[r, idx[0]]), (r, key)
        ts.append(t_pos[r, idx[0]])
        if key[0] > 0 and elig[r, idx].any():
          assert masked[r, idx].any(), (r, key)  # at least one mask per block
      assert len(set(ts)) == len(ts)  # independent draws
    targets, weights = np.asarray(inputs.targets), np.asarray(inputs.weights)
    assert not weights[:, l:].any()  # no loss on the clean stream
    want_w = masked / t_pos
    if shift:
      np.testing.assert_array_equal(targets[:, :l - 1], nb["tokens"][:, 1:])
      np.testing.assert_allclose(weights[:, :l - 1], want_w[:, 1:], rtol=1e-6)
    else:
      np.testing.assert_array_equal(targets[:, :l], nb["tokens"])
      np.testing.assert_allclose(weights[:, :l], want_w, rtol=1e-6)


def test_bd3lm_attention_equals_description():
  obj = objective("bd3lm", block_size=3)
  batch = make_batch([[(0, 16)], [(2, 5), (0, 9)], [(3, 7)]], 16)
  nb = np_batch(batch)
  inputs = run(obj, batch, 0)
  meta = (inputs.positions, inputs.streams, inputs.segment_ids)
  got = np.asarray(dense_mask(inputs.mask, meta, meta))
  for r in range(3):
    want = ref.two_stream_mask(ref.bd3lm_rule, nb["positions"][r], nb["segment_ids"][r], 3,
                               noisy_first=True)
    bad = np.argwhere(got[r] != want)
    assert not len(bad), f"row {r}: (query, key) {bad[:5].tolist()}"


@pytest.mark.parametrize("shift", [False, True])
def test_bd3lm_loss_equals_numpy(shift):
  obj = objective("bd3lm", block_size=B_BD, shift=shift)
  batch = make_batch(DIFF_ROWS, 16)
  nb = np_batch(batch)
  inputs = run(obj, batch, 4)
  logits = random_logits((len(DIFF_ROWS), 32), seed=3)
  loss, metrics = jitted(obj)[1](logits, inputs)
  masked = np.asarray(inputs.aux["masked"])
  want = ref.diffusion_loss(np.asarray(logits)[:, :16], nb["tokens"], nb["segment_ids"],
                            nb["loss_mask"], masked, np.asarray(inputs.aux["t"]), shift)
  np.testing.assert_allclose(float(loss), want, rtol=1e-5)
  assert float(metrics["loss/bd3lm"]) == float(loss)
  np.testing.assert_allclose(float(metrics["bd3lm/mask_ratio"]),
                             masked.sum() / _maskable(nb, shift).sum(), rtol=1e-6)


def test_bd3lm_forward_equals_block_causal_forwards(model):
  """Noisy block k sees exactly (clean blocks < k, all of noisy block k): a block_causal
  forward of that sequence; the clean stream is a block_causal forward of the clean row."""
  l, blk = 16, B_BD
  obj = objective("bd3lm", block_size=blk)
  batch = make_batch([[(0, 16)]], l, seed=6)
  inputs = run(obj, batch, 0)
  dual = forward(model, inputs.tokens, inputs.positions, inputs.segment_ids, inputs.streams,
                 inputs.mask)[0]
  x_t, x_0 = np.asarray(inputs.tokens)[0, :l], np.asarray(inputs.tokens)[0, l:]
  nblk = l // blk
  rows = np.stack([x_0] + [np.concatenate([x_0[:k * blk], x_t[k * blk:]])
                           for k in range(nblk)])
  sep = forward(model, rows, np.repeat(np.arange(l)[None], nblk + 1, 0),
                np.ones((nblk + 1, l)), np.zeros((nblk + 1, l)), MaskSpec("block_causal", blk))
  np.testing.assert_allclose(dual[l:], sep[0], atol=1e-5)
  for k in range(nblk):
    sl = slice(k * blk, (k + 1) * blk)
    np.testing.assert_allclose(dual[:l][sl], sep[k + 1, sl], atol=1e-5, err_msg=f"block {k}")
