"""Tile tables: the per-tile reduction of the dense mask, and what MARS's pattern skips."""

import numpy as np
import pytest

from cardjax.attention import MaskSpec, dense_mask
from cardjax.attention.tiles import (EMPTY, FULL, PARTIAL, row_layout, skipped_fraction,
                                     tile_table)

SPECS = [MaskSpec("causal"), MaskSpec("bidirectional"), MaskSpec("dual_stream", 4),
         MaskSpec("bd3lm", 8), MaskSpec("block_causal", 4)]


def reference_table(spec, meta, bq, bk):
  """Dense mask of the whole row (the XLA path's function), padded, reduced per tile."""
  pos, streams, seg = (np.asarray(a)[None] for a in meta)
  ok = np.asarray(dense_mask(spec, (pos, streams, seg), (pos, streams, seg)))[0]
  ok &= (seg[0][:, None] > 0) & (seg[0][None] > 0)
  t = ok.shape[0]
  nq, nk = -(-t // bq), -(-t // bk)
  padded = np.zeros((nq * bq, nk * bk), bool)
  padded[:t, :t] = ok
  real = np.zeros_like(padded)
  real[:t, :t] = True
  tiles = padded.reshape(nq, bq, nk, bk)
  full = tiles.all(axis=(1, 3)) & real.reshape(nq, bq, nk, bk).all(axis=(1, 3))
  return np.where(full, FULL, np.where(tiles.any(axis=(1, 3)), PARTIAL, EMPTY))


@pytest.mark.parametrize("spec", SPECS, ids=lambda s: s.kind)
@pytest.mark.parametrize("length,documents,bq,bk", [(40, 1, 16, 8), (37, 3, 8, 16),
                                                    (64, 2, 32, 32), (23, 1, 5, 7)])
def test_tile_table_is_the_tile_reduction_of_the_dense_mask(spec, length, documents, bq, bk):
  meta = row_layout(spec.kind, length, documents=documents)
  got = tile_table(spec, meta, meta, bq, bk)
  np.testing.assert_array_equal(got, reference_table(spec, meta, bq, bk))


def test_padding_slots_are_never_visible():
  """Segment 0 (padding) rows and keys: their tiles are empty."""
  pos, streams, seg = row_layout("causal", 32)
  seg = seg.copy()
  seg[16:] = 0
  table = tile_table(MaskSpec("causal"), (pos, streams, seg), (pos, streams, seg), 8, 8)
  assert (table[2:] == EMPTY).all() and (table[:, 2:] == EMPTY).all()


@pytest.mark.parametrize("length", [512, 2048])
def test_mars_skips_the_clean_to_noisy_quarter_and_out_of_block_noisy_tiles(length):
  """MARS dual stream [clean | noisy], B = 4 < tile: clean queries never see noisy keys (a
  quarter of all tiles) and a noisy query sees noisy keys only in its own block, so of the
  noisy->noisy quadrant only the diagonal tiles are visited."""
  spec, tile = MaskSpec("dual_stream", 4), 128
  meta = row_layout("dual_stream", length)
  table = tile_table(spec, meta, meta, tile, tile)
  half = length // tile
  assert (table[:half, half:] == EMPTY).all()
  noisy = table[half:, half:]
  assert (noisy[~np.eye(half, dtype=bool)] == EMPTY).all()
  assert (np.diag(noisy) != EMPTY).all()
  assert skipped_fraction(table) >= 0.25 + 0.25 * (1 - 1 / half)


def test_bad_tile_sizes():
  meta = row_layout("causal", 8)
  with pytest.raises(ValueError, match="tile sizes"):
    tile_table(MaskSpec("causal"), meta, meta, 0, 8)
