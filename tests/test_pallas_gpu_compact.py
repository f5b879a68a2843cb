"""The Pallas GPU kernel (interpret mode on CPU) on MARS's compact noisy stream
(MaskSpec.noisy_len = N: [clean (L) | the kept blocks, then filler (N)]).

The metadata comes from the MARS objective's own corrupt on packed multi-turn rows with
padding before and after the documents, an empty row, documents ending mid-block, and an
odd total length (L + N = 63 + 40) that is no tile multiple. Every token sees itself, so
every row (padding and filler included) is compared with the dense reference. Tolerance:
float32 throughout, 2e-5 (as tests/test_pallas_gpu.py). Selection: attention_impl may now
name pallas_gpu for a compact row, and auto picks it on GPU (splash serves it on TPU:
tests/test_attention_splash_compact.py).
"""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from cardjax.attention import dense_mask, reference_attention, select
from cardjax.attention import pallas_gpu as pg
from cardjax.attention.select import AttentionImplError, choose
from compact_helpers import compact_corrupt, out_and_grads, sft_batch

B, L, FRACTION = 4, 63, 0.6  # N = ceil(0.6 * 63 / 4) * 4 = 40 slots
TOL = 2e-5
# Per row: (padding before, documents); a document is (tokens, carries loss) spans.
ROWS = [(0, [[(5, False), (7, True)], [(3, False), (4, True), (6, False), (3, True)],
             [(6, False), (9, True)]]),
        (5, [[(9, False), (8, True)], [(4, False), (5, True)]]),
        (0, [[(10, False), (20, True)], [(2, False), (3, True)]]),
        (7, [[(16, True)], [(12, False), (12, True)]]),
        (L, [])]


def compact_inputs(rows, length, fraction, seed=0):
  """(spec, (positions, streams, segments) [rows, L + N]) of MARS's compact corrupt."""
  inputs = compact_corrupt(sft_batch(rows, length, seed), B, fraction)
  return inputs.mask, (inputs.positions, inputs.streams, inputs.segment_ids)


@pytest.mark.parametrize("blocks", [(16, 32), (32, 16)], ids=["16x32", "32x16"])
def test_outputs_and_gradients_equal_the_dense_reference(blocks):
  """Forward output and dq, dk, dv (GQA 2) of the interpreted kernel equal the dense
  reference on every token of the compact rows; the rows in two orders (two metadata
  draws, one compilation)."""
  spec = compact_inputs(ROWS, L, FRACTION)[0]
  kernel = lambda q, k, v, spec, qm, km: pg.pallas_gpu_attention(  # noqa: E731
      q, k, v, spec, qm, km, interpret=True, block_q=blocks[0], block_k=blocks[1])
  got_fn, ref_fn = out_and_grads(kernel, spec), out_and_grads(reference_attention, spec)
  for seed, rows in enumerate((ROWS, ROWS[::-1])):
    _, meta = compact_inputs(rows, L, FRACTION)
    b, t = meta[0].shape
    assert (spec.noisy_len, t) == (40, L + 40)
    assert bool(np.asarray(dense_mask(spec, meta, meta)).any(-1).all())  # no empty row
    keys = jax.random.split(jax.random.key(seed), 4)
    q = jax.random.normal(keys[0], (b, t, 4, 16))
    k, v = (jax.random.normal(x, (b, t, 2, 16)) for x in keys[1:3])
    w = jax.random.normal(keys[3], (b, t, 4, 16))
    (out, grads), (ref_out, ref_grads) = got_fn(q, k, v, w, meta), ref_fn(q, k, v, w, meta)
    np.testing.assert_allclose(np.asarray(out), np.asarray(ref_out), rtol=TOL, atol=TOL,
                               err_msg="output")
    for name, g, r in zip(("dq", "dk", "dv"), grads, ref_grads):
      r = np.asarray(r)
      np.testing.assert_allclose(np.asarray(g), r, rtol=TOL, atol=TOL * max(1.0, np.abs(r).max()),
                                 err_msg=name)


def tile_reduction(spec, meta, bq, bk):
  """(any visible, all visible) per tile of the dense mask, [rows, nq, nk]: padded query
  rows never matter, a key tile with padded slots is never all visible."""
  ok = np.asarray(dense_mask(spec, meta, meta))
  rows, t, _ = ok.shape
  nq, nk = -(-t // bq), -(-t // bk)
  seen = np.zeros((rows, nq * bq, nk * bk), bool)
  seen[:, :t, :t] = ok
  counted = seen.copy()
  counted[:, t:] = True  # padded query rows: any answer is right for them
  key_whole = np.arange(nk) < t // bk
  return (seen.reshape(rows, nq, bq, nk, bk).any(axis=(2, 4)),
          counted.reshape(rows, nq, bq, nk, bk).all(axis=(2, 4)) & key_whole)


def assert_sound(spec, meta, classes, bq, bk):
  any_v, all_v = tile_reduction(spec, meta, bq, bk)
  assert not (any_v & (classes == pg.EMPTY)).any(), "a visible pair in an EMPTY tile"
  assert not (~all_v & (classes == pg.FULL)).any(), "an invisible pair in a FULL tile"


def test_packed_rows_table_is_sound_and_skips_clean_to_noisy_tiles():
  """On the packed rows: EMPTY / FULL only where the dense mask proves them, every tile of
  clean queries over noisy keys is EMPTY, and the visit table lists none of them."""
  spec, meta = compact_inputs(ROWS, L, FRACTION)
  bq = bk = 16
  classes = np.asarray(pg.tile_classes(spec, meta, meta, bq, bk))
  assert_sound(spec, meta, classes, bq, bk)
  clean_q, noisy_k = L // bq, -(-L // bk)  # query tiles wholly clean, key tiles wholly noisy
  assert (classes[:, :clean_q, noisy_k:] == pg.EMPTY).all()
  table = np.asarray(pg.visit_table(jnp.asarray(classes)))
  for row in table[:, :clean_q].reshape(-1, table.shape[-1]):
    visited = row[2:2 + row[0] + row[1]]
    assert (visited < noisy_k).all() and len(visited) > 0


def test_long_row_skips_clean_to_noisy_and_out_of_block_tiles():
  """One 512-token document (prompt 196, response 316), B = 4, tile 64: N = 336 slots hold
  the 320 kept tokens (the response's blocks and the block of the last prompt token), then
  16 filler. The table is sound, skips every clean -> noisy tile and every noisy -> noisy
  tile off the diagonal, and skips over a third of all tiles. (The kept tokens fill whole
  tiles here: a tile that mixes kept tokens and filler, position 0 and segment 0, has
  loose bounds and is visited as PARTIAL; exact, only slower.)"""
  length, tile = 512, 64
  spec, meta = compact_inputs([(0, [[(196, False), (316, True)]])], length, 0.65)
  assert spec.noisy_len == 336
  classes = np.asarray(pg.tile_classes(spec, meta, meta, tile, tile))
  assert_sound(spec, meta, classes, tile, tile)
  half = length // tile
  assert (classes[0, :half, half:] == pg.EMPTY).all()
  noisy = classes[0, half:, half:]
  assert (noisy[~np.eye(len(noisy), dtype=bool)] == pg.EMPTY).all()
  assert pg.visit_fractions(classes)["skipped"] > 1 / 3


def test_selection_serves_compact_with_pallas_gpu_and_xla(monkeypatch):
  """attention_impl=pallas_gpu runs a compact row (on GPU or interpreted), auto picks it on
  GPU, TPU's auto takes splash (its scatter and gather route), and cuDNN refuses it with
  its reason."""
  monkeypatch.setattr(select, "_logged", set())
  monkeypatch.delenv(select.INTERPRET_ENV, raising=False)
  spec = compact_inputs(ROWS, L, FRACTION)[0]
  q, kv = (2, L + 40, 4, 64), (2, L + 40, 2, 64)
  assert choose("pallas_gpu", spec, q, kv, jnp.bfloat16, platform="gpu") == "pallas_gpu"
  assert choose("pallas_gpu", spec, q, kv, interpret=True) == "pallas_gpu"
  assert choose("auto", spec, q, kv, jnp.bfloat16, platform="gpu") == "pallas_gpu"
  assert choose("auto", spec, q, kv, platform="tpu") == "splash"
  with pytest.raises(AttentionImplError, match="cuDNN serves.*not 'dual_stream'"):
    choose("cudnn", spec, q, kv, jnp.bfloat16, platform="gpu")
