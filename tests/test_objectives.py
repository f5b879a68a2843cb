"""The training objectives (cardjax/objectives: card, mars, mdlm, bd3lm) against plain-numpy
renderings of METHODS.md sections 1, 2 and 4 (tests/objectives_reference.py)."""

from __future__ import annotations

import functools

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx

import objectives_reference as ref
from conftest import packed_batch
from cardjax.attention import MaskSpec, dense_mask
from cardjax.config import base_config
from cardjax.errors import ConfigError
from cardjax.model import ModelConfig, create_model
from cardjax.objectives import OBJECTIVES, make_objective
from cardjax.objectives.base import ModelInputs

V, MASK = 64, 63
MODEL_CFG = ModelConfig(vocab_size=V, hidden_size=32, intermediate_size=64, num_layers=2,
                        num_heads=4, num_kv_heads=2, mask_token_id=MASK)


def objective(name, **fields):
  """The objective for base_config().objective with these fields set (one instance per
  setting, so its jitted functions compile once per shape across the tests)."""
  return _objective(name, tuple(sorted(fields.items())))


@functools.lru_cache(maxsize=None)
def _objective(name, fields):
  cfg = base_config().objective
  cfg.name = name
  for key, value in fields:
    cfg[key] = value
  return make_objective(cfg, MODEL_CFG)


def make_batch(rows, length, seed=0):
  """See conftest.packed_batch; token ids never equal the [MASK] id."""
  return packed_batch(rows, length, seed, vocab_high=MASK)


def np_batch(batch):
  return {k: np.asarray(v) for k, v in batch.items()}


@functools.lru_cache(maxsize=None)
def jitted(obj):
  return jax.jit(obj.corrupt), jax.jit(obj.loss)


def run(obj, batch, seed):
  corrupt, _ = jitted(obj)
  return corrupt(batch, jax.random.key(seed))


def random_logits(shape, seed=0):
  return jnp.asarray(np.random.default_rng(seed).normal(0, 2, shape + (V,)), jnp.float32)


# Rows shared by the CARD tests: full rows, rows padded at the end, packed rows.
PRETRAIN_ROWS = [[(0, 32)], [(0, 32)], [(0, 20)], [(0, 7)], [(0, 12), (0, 20)],
                 [(0, 9), (0, 11)], [(0, 1)], []]


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


@pytest.fixture(scope="module")
def model():
  return create_model(MODEL_CFG, seed=0)


@functools.partial(nnx.jit, static_argnames=("mask",))
def _forward(model, tokens, positions, segment_ids, streams, mask):
  return model(tokens, positions=positions, segment_ids=segment_ids, streams=streams, mask=mask)


def forward(model, tokens, positions, segment_ids, streams, mask):
  args = (jnp.asarray(np.asarray(a), jnp.int32)
          for a in (tokens, positions, segment_ids, streams))
  return np.asarray(_forward(model, *args, mask=mask))


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


# === all objectives ==========================================================================

ALL = [("card", {}), ("card", {"card_masking": "uniform"}), ("mars", {}), ("mdlm", {}),
       ("mdlm", {"shift": True}), ("bd3lm", {}), ("bd3lm", {"shift": True})]


@pytest.mark.parametrize("name,fields,match", [
    ("card", {"card_masking": "tail"}, "card_masking"),
    ("card", {"card_reweighting": "inverse"}, "card_reweighting"),
    ("card", {"card_lambda": 0.5}, "card_lambda"),
    ("card", {"card_beta": 0.0}, "card_beta"),
    ("card", {"card_p": 1.5}, "card_p"),
    ("card", {"clean_fraction": 2.0}, "clean_fraction"),
    ("mars", {"block_size": 0}, "block_size"),
    ("mars", {"alpha": -1.0}, "alpha"),
    ("bd3lm", {"block_size": 0}, "block_size"),
    ("mdlm", {"t_eps": 1.0}, "t_eps"),
    ("bd3lm", {"t_eps": -0.1}, "t_eps"),
])
def test_bad_config_values(name, fields, match):
  with pytest.raises(ConfigError, match=match):
    objective(name, **fields)


@pytest.mark.parametrize("name", ["card", "mars", "mdlm", "bd3lm"])
@pytest.mark.parametrize("mask_id", [-1, V])
def test_mask_token_id_required(name, mask_id):
  cfg = base_config().objective
  cfg.name = name
  model_cfg = ModelConfig(vocab_size=V, hidden_size=32, intermediate_size=64, num_layers=2,
                          num_heads=4, num_kv_heads=2, mask_token_id=mask_id)
  with pytest.raises(ConfigError, match="mask_token_id"):
    make_objective(cfg, model_cfg)


@pytest.mark.parametrize("name,fields", ALL)
def test_jit_determinism_per_row_and_normalizer(name, fields):
  """Under jit, as the trainer runs it: each row corrupted with its own key (vmapped over
  single-row batches), then the loss. Same keys give the same result, other keys another
  one (MARS has no randomness); the vmapped rows equal single-row calls; and
  loss(batch) * normalizer(batch) = the sum over rows of the same for that row alone, so
  weighting micro-batches by the normalizer reproduces the large batch."""
  obj = objective(name, **fields)
  assert OBJECTIVES[name] is type(obj) and obj.name == name
  rows = [[(0, 16)], [(3, 13)], [(0, 7), (0, 9)], [], [(2, 6)]]
  batch = make_batch(rows, 16)

  def keys(seed):
    return jax.vmap(lambda r: jax.random.fold_in(jax.random.key(seed), r))(
        jnp.arange(len(rows)))

  def one(row, key):
    out = obj.corrupt({k: v[None] for k, v in row.items()}, key)
    return jax.tree.map(lambda x: x[0], out)

  @jax.jit
  def step(batch, keys):
    inputs = jax.vmap(one)(batch, keys)
    logits = random_logits(inputs.tokens.shape, seed=4)
    return inputs, obj.loss(logits, inputs), obj.normalizer(inputs)

  a_in, (a_loss, a_metrics), a_norm = step(batch, keys(0))
  b_in, (b_loss, _), _ = step(batch, keys(0))
  c_in, (c_loss, _), _ = step(batch, keys(1))
  assert isinstance(a_in, ModelInputs)
  assert a_in.tokens.shape == (len(rows), 16 * obj.stream_factor)
  assert np.isfinite(float(a_loss)) and float(a_metrics[f"loss/{name}"]) == float(a_loss)
  for x, y in zip(jax.tree.leaves(a_in), jax.tree.leaves(b_in)):
    np.testing.assert_array_equal(np.asarray(x), np.asarray(y))
  assert float(a_loss) == float(b_loss)
  if name == "mars":  # no randomness by design
    np.testing.assert_array_equal(np.asarray(a_in.tokens), np.asarray(c_in.tokens))
  else:
    assert not np.array_equal(np.asarray(a_in.tokens), np.asarray(c_in.tokens))
    assert float(a_loss) != float(c_loss)

  corrupt, loss_fn = jitted(obj)
  logits = random_logits(a_in.tokens.shape, seed=4)
  total = 0.0
  for r, key in enumerate(keys(0)):
    row_in = corrupt({k: v[r:r + 1] for k, v in batch.items()}, key)
    for x, y in zip(jax.tree.leaves(row_in), jax.tree.leaves(a_in)):
      np.testing.assert_allclose(np.asarray(x)[0], np.asarray(y)[r], rtol=1e-6)
    row_loss, _ = loss_fn(logits[r:r + 1], row_in)
    total += float(row_loss) * float(obj.normalizer(row_in))
  assert float(a_norm) == len(rows) - 1  # the empty row carries no loss
  np.testing.assert_allclose(float(a_loss) * float(a_norm), total, rtol=1e-5)
