"""Splash on MARS's compact noisy stream (cardjax/attention/splash_compact.py: the kept
blocks scattered into an aligned [clean | noisy (L)] row for the static dual_stream mask,
the outputs gathered back), on CPU in Pallas interpret mode as tests/test_attention_splash.py
runs splash.

The metadata comes from the MARS objective's own corrupt on rows that follow splash's
layout contract as the SFT pipeline builds them: several conversations packed per row,
each EOS-padded to a multiple of B (the padding carries loss, as ChatRow's does), padding
before and after the documents (the leading one a whole number of blocks), a full row and
an empty row. Forward outputs on every real token and dq, dk, dv of a loss over the real
tokens equal the dense reference on the compact metadata (float32, tolerances as
tests/test_attention_splash.py); filler and padding give 0. A misplaced scatter (the
counterpart index off by a block) fails `test_counterparts_are_the_clean_tokens_of_the_same_
segment_and_position` directly and the reference comparison through the outputs.

2L = 96 (one 128-wide tile), 4 query heads over 2 kv heads, head_dim 16: interpret mode
walks the grid in Python, so rows stay small.
"""

from __future__ import annotations

import dataclasses

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx

from cardjax.attention import reference_attention, select
from cardjax.attention.select import AttentionImplError, choose
from cardjax.attention.splash import check_layout, layout_problems, splash_attention
from cardjax.attention.splash_compact import counterparts
from cardjax.model import create_model
from compact_helpers import FAST_COMPILE, compact_corrupt, out_and_grads, sft_batch
from objectives_helpers import MODEL_CFG, objective

B, L, FRACTION = 4, 48, 0.6  # N = ceil(0.6 * 48 / 4) * 4 = 32 slots
TOL = (1e-5, 5e-5)  # float32: outputs, gradients (online vs one-shot softmax)
# Per row: (padding before, conversations); a conversation is (tokens, carries loss) spans
# whose total is a multiple of B. Multi-turn, responses starting mid-block and right after
# a block edge, a response at a document's start, a full row, an empty row.
ROWS = [(0, [[(5, False), (7, True)], [(3, False), (4, True), (6, False), (3, True)]]),
        (4, [[(9, False), (11, True)], [(6, False), (6, True)]]),
        (0, [[(20, False), (12, True)], [(6, False), (10, True)]]),
        (8, [[(16, True)], [(13, False), (11, True)]]),
        (L, [])]


def compact_inputs(rows, seed=0):
  """(spec, (positions, streams, segments) [rows, L + N], data batch) of MARS's compact
  corrupt of these rows."""
  batch = sft_batch(rows, L, seed, block=B)
  inputs = compact_corrupt(batch, B, FRACTION)
  meta = tuple(np.asarray(x) for x in (inputs.positions, inputs.streams, inputs.segment_ids))
  return inputs.mask, meta, batch


def test_counterparts_are_the_clean_tokens_of_the_same_segment_and_position():
  """Each kept noisy token's index is the clean token with its (segment, position), found
  by a numpy search; filler gets L. A scatter off by one block would fail here."""
  spec, meta, _ = compact_inputs(ROWS)
  assert spec.noisy_len == 32 and layout_problems(spec, meta, meta) == []
  got = np.asarray(counterparts(spec, meta))
  pos, _, seg = meta
  for r in range(len(ROWS)):
    clean = {(s, p): i for i, (s, p) in enumerate(zip(seg[r, :L], pos[r, :L])) if s > 0}
    want = [clean[(s, p)] if s > 0 else L for s, p in zip(seg[r, L:], pos[r, L:])]
    np.testing.assert_array_equal(got[r], want, err_msg=f"row {r}")
  assert (got[-1] == L).all()  # the empty row: all filler
  assert (got < L).sum() == 20 + 20 + 28 + 28  # every kept token of rows 0..3 is placed


def test_outputs_and_gradients_equal_the_reference():
  """Output on every real token (clean and kept noisy) and dq, dk, dv (GQA 2) equal the
  dense reference on the compact metadata, for the rows in two orders (traced metadata:
  one compilation); filler and padding outputs are exactly 0."""
  spec = compact_inputs(ROWS)[0]
  kernel = lambda q, k, v, spec, qm, km: splash_attention(  # noqa: E731
      q, k, v, spec, qm, km, interpret=True)
  got_fn, ref_fn = out_and_grads(kernel, spec), out_and_grads(reference_attention, spec)
  for seed, rows in enumerate((ROWS, ROWS[::-1])):
    _, meta, _ = compact_inputs(rows, seed)
    b, t = meta[0].shape
    real = meta[2] > 0
    keys = jax.random.split(jax.random.key(seed), 4)
    q = jax.random.normal(keys[0], (b, t, 4, 16))
    k, v = (jax.random.normal(x, (b, t, 2, 16)) for x in keys[1:3])
    # Loss on real tokens only: filler and padding carry none.
    w = jax.random.normal(keys[3], (b, t, 4, 16)) * real[:, :, None, None]
    (out, grads), (ref_out, ref_grads) = got_fn(q, k, v, w, meta), ref_fn(q, k, v, w, meta)
    out, ref_out = np.asarray(out), np.asarray(ref_out)
    np.testing.assert_allclose(out[real], ref_out[real], rtol=TOL[0], atol=TOL[0],
                               err_msg="output")
    assert (out[~real] == 0).all()
    for name, g, r in zip(("dq", "dk", "dv"), grads, ref_grads):
      g, r = np.asarray(g), np.asarray(r)
      assert np.isfinite(g).all(), name
      np.testing.assert_allclose(g, r, rtol=TOL[1], atol=TOL[1] * max(1.0, np.abs(r).max()),
                                 err_msg=name)


def test_mars_compact_loss_and_gradients_through_splash_equal_xla(monkeypatch):
  """A MARS compact step's loss and parameter gradients with attention_impl=splash
  (interpreted) equal attention_impl=xla's (the structured path) on the same weights."""
  monkeypatch.setenv(select.INTERPRET_ENV, "1")
  _, _, batch = compact_inputs(ROWS)
  obj = objective("mars", block_size=B, noisy_fraction=FRACTION)
  inputs = jax.jit(obj.corrupt)(batch, jax.random.key(0))
  results = []
  for impl in ("xla", "splash"):
    cfg = dataclasses.replace(MODEL_CFG, attention_impl=impl)
    graphdef, params = nnx.split(create_model(cfg, seed=0), nnx.Param)

    def loss_fn(params, graphdef=graphdef):
      m = nnx.merge(graphdef, params)
      logits = m(inputs.tokens, positions=inputs.positions, segment_ids=inputs.segment_ids,
                 streams=inputs.streams, mask=inputs.mask)
      return obj.loss(logits, inputs)[0]

    loss, grads = jax.jit(jax.value_and_grad(loss_fn), compiler_options=FAST_COMPILE)(params)
    results.append((float(loss), jax.tree.leaves(grads)))
  (xla_loss, xla_grads), (splash_loss, splash_grads) = results
  assert np.isfinite(xla_loss) and splash_loss == pytest.approx(xla_loss, rel=1e-5)
  for a, b in zip(xla_grads, splash_grads):
    np.testing.assert_allclose(np.asarray(b), np.asarray(a), rtol=1e-4, atol=1e-6)


def test_layout_check_names_a_broken_compact_row():
  """A kept block that lost a token, and noisy tokens of a segment the clean stream does
  not hold, are named; splash refuses them eagerly with the fix."""
  spec, meta, _ = compact_inputs(ROWS)
  pos, streams, seg = (x.copy() for x in meta)
  # Row 0's first kept token (segment 1, position 4) becomes filler: block 1 is not whole.
  assert (seg[0, L], pos[0, L]) == (1, 4)
  seg[0, L], pos[0, L] = 0, 0
  broken = (pos, streams, seg)
  problems = layout_problems(spec, broken, broken)
  assert any("keeps 3 of the 4 tokens of block 1" in p and "whole blocks" in p
             for p in problems), problems
  with pytest.raises(ValueError, match="layout contract.*attention_impl=xla"):
    splash_attention(*(jnp.zeros((5, L + 32, 2, 16)),) * 3, spec, broken, broken,
                     interpret=True)
  pos, streams, seg = (x.copy() for x in meta)
  seg[1, L:][seg[1, L:] == 2] = 9  # row 1's second conversation's kept blocks: segment 9
  broken = (pos, streams, seg)
  assert any(p.startswith("row 1: 8 noisy token(s) have no clean token of the same segment")
             for p in layout_problems(spec, broken, broken))
  # Under jit nothing is checked: such tokens are dropped (output 0), never misplaced.
  assert (np.asarray(counterparts(spec, broken))[1][seg[1, L:] == 9] == L).all()
  with pytest.raises(ValueError, match="no clean token of the same segment"):
    check_layout(spec, broken, broken)


def test_selection_accepts_splash_for_the_compact_stream(monkeypatch):
  """attention_impl=splash serves a compact row on TPU and interpreted on CPU, TPU's auto
  picks it; a noisy stream longer than the clean one is refused with the reason."""
  monkeypatch.setattr(select, "_logged", set())
  monkeypatch.delenv(select.INTERPRET_ENV, raising=False)
  spec = compact_inputs(ROWS)[0]
  q, kv = (2, L + 32, 4, 64), (2, L + 32, 2, 64)
  assert choose("splash", spec, q, kv, platform="tpu") == "splash"
  assert choose("splash", spec, q, kv, interpret=True) == "splash"
  assert choose("auto", spec, q, kv, platform="tpu") == "splash"
  assert choose("auto", spec, q, kv) == "xla"  # CPU
  with pytest.raises(AttentionImplError, match="cannot be longer than the clean stream"):
    choose("splash", type(spec)("dual_stream", B, noisy_len=40), (2, 70, 4, 64),
           (2, 70, 2, 64), platform="tpu")
