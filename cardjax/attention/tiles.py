"""Which (query tile, key tile) blocks of an attention pattern a kernel must visit.

A block-sparse attention kernel splits the [queries x keys] score matrix into tiles of
block_q x block_k and, per query tile, visits only the key tiles that hold a visible pair:
an EMPTY tile is skipped, a FULL tile needs no mask work, a PARTIAL tile evaluates the
mask per element. The classification uses the same predicate as every other consumer
(MaskSpec.allowed over position, stream and segment ids), evaluated on the host in numpy, one
query tile at a time (so an 8192-token MARS row, 16384 x 16384 pairs, never needs a dense
mask). Lengths that are not tile multiples are padded with invisible slots: a tile that
holds padding is never FULL.
"""

from __future__ import annotations

import numpy as np

from cardjax.attention.masks import CLEAN, NOISY, MaskSpec

EMPTY, PARTIAL, FULL = 0, 1, 2


def tile_table(spec: MaskSpec, q_meta, k_meta, block_q: int, block_k: int) -> np.ndarray:
  """[ceil(Tq / block_q), ceil(Tk / block_k)] int8 of EMPTY / PARTIAL / FULL for one row.

  q_meta, k_meta: (positions, streams, segment_ids), each a 1-D array of that side's
  length; segment id 0 is padding (never visible), as in the model's inputs."""
  if block_q < 1 or block_k < 1:
    raise ValueError(f"tile sizes must be >= 1, got {block_q} x {block_k}")
  qp, qs, qg = (np.asarray(a) for a in q_meta)
  kp, ks, kg = (np.asarray(a) for a in k_meta)
  nq, nk = -(-len(qp) // block_q), -(-len(kp) // block_k)
  pad_k = nk * block_k - len(kp)
  kp, ks = np.pad(kp, (0, pad_k)), np.pad(ks, (0, pad_k))
  kg = np.pad(kg, (0, pad_k))  # padding keys get segment 0: never visible
  out = np.empty((nq, nk), np.int8)
  for i in range(nq):
    sl = slice(i * block_q, (i + 1) * block_q)
    p, s, g = qp[sl], qs[sl], qg[sl]
    ok = spec.allowed(p[:, None], kp[None], s[:, None], ks[None], g[:, None], kg[None])
    ok &= (g[:, None] > 0) & (kg[None] > 0)
    ok = ok.reshape(len(p), nk, block_k)
    anyv, allv = ok.any(axis=(0, 2)), ok.all(axis=(0, 2)) & (len(p) == block_q)
    out[i] = np.where(allv, FULL, np.where(anyv, PARTIAL, EMPTY))
  return out


def row_layout(kind: str, length: int, documents: int = 1):
  """(positions, streams, segments) of one training row of `length` data tokens as the
  objectives lay it out: one stream for causal / bidirectional / block_causal, [clean |
  noisy] for MARS's dual_stream, [noisy | clean] for bd3lm; `documents` packed documents of
  equal length (segment ids 1..documents)."""
  seg = 1 + np.arange(length) * documents // length
  starts = np.searchsorted(seg, seg)  # first index of each token's document
  pos = np.arange(length) - starts
  zeros = np.zeros(length, np.int32)
  if kind == "dual_stream":
    return (np.concatenate([pos, pos]), np.concatenate([zeros + CLEAN, zeros + NOISY]),
            np.concatenate([seg, seg]))
  if kind == "bd3lm":
    return (np.concatenate([pos, pos]), np.concatenate([zeros + NOISY, zeros + CLEAN]),
            np.concatenate([seg, seg]))
  return pos, zeros, seg


def skipped_fraction(table: np.ndarray) -> float:
  """The share of tiles a block-sparse kernel never visits."""
  return float((table == EMPTY).mean())
