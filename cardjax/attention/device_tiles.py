"""The device pre-pass of the block-sparse GPU kernels: per (query tile, key tile) pair a
class EMPTY / PARTIAL / FULL from per-tile bounds of the real metadata, and per query tile a
visit table that lists the FULL then the PARTIAL key tiles.

The Triton kernels (pallas_gpu.py, whose docstring gives the rules and why they are exact)
and the Hopper kernels (pallas_mgpu.py, pallas_mgpu_bwd.py) walk the same tables; this
module is the one both import, so neither kernel module imports the other's.
"""

from __future__ import annotations

import functools

import jax
import jax.numpy as jnp
import numpy as np
from jax.experimental import pallas as pl

from cardjax.attention.masks import CLEAN, NOISY, MaskSpec

EMPTY, PARTIAL, FULL = 0, 1, 2  # the values of cardjax.attention.tiles


def _summaries(meta, block: int, spec: MaskSpec):
  """Per tile (lo, hi) of position, block id, stream and segment over the REAL slots.

  meta: (positions, streams, segments), each [b, n]; returns a dict of [b, tiles] pairs."""
  n = meta[0].shape[1]
  tiles = -(-n // block)
  pad = tiles * block - n
  valid = jnp.pad(jnp.ones((n,), bool), (0, pad)).reshape(tiles, block)
  big = jnp.iinfo(jnp.int32).max

  def lo_hi(x):
    x = jnp.pad(x.astype(jnp.int32), ((0, 0), (0, pad))).reshape(x.shape[0], tiles, block)
    return (jnp.min(jnp.where(valid, x, big), axis=-1),
            jnp.max(jnp.where(valid, x, -big), axis=-1))

  pos, stream, seg = (lo_hi(x) for x in meta)
  out = {"pos": pos, "stream": stream, "seg": seg}
  if spec.block_size > 0:  # floor division is monotone, so the bounds carry over
    out["blk"] = (pos[0] // spec.block_size, pos[1] // spec.block_size)
  return out


def _rule_bounds(spec: MaskSpec, q, k):
  """(possible, certain): some pair of the two boxes may satisfy the rule (without the
  segment test) / every pair does. q, k: _summaries broadcast to [b, nq, 1] / [b, 1, nk]."""
  true = jnp.ones((), bool)
  if spec.kind == "bidirectional":
    return true, true
  if spec.kind == "causal":
    return k["pos"][0] <= q["pos"][1], k["pos"][1] <= q["pos"][0]
  qb, kb = q["blk"], k["blk"]
  if spec.kind == "block_causal":
    return kb[0] <= qb[1], kb[1] <= qb[0]

  def has(side, s):
    return (side["stream"][0] <= s) & (s <= side["stream"][1])

  def only(side, s):
    return (side["stream"][0] == s) & (side["stream"][1] == s)

  blocks_meet = (kb[0] <= qb[1]) & (qb[0] <= kb[1])
  one_block = (qb[0] == qb[1]) & (kb[0] == kb[1]) & (qb[0] == kb[0])
  earlier_any, earlier_all = kb[0] < qb[1], kb[1] < qb[0]
  causal_any, causal_all = k["pos"][0] <= q["pos"][1], k["pos"][1] <= q["pos"][0]
  qc, qn, kc, kn = has(q, CLEAN), has(q, NOISY), has(k, CLEAN), has(k, NOISY)
  qc1, qn1, kc1, kn1 = only(q, CLEAN), only(q, NOISY), only(k, CLEAN), only(k, NOISY)
  if spec.kind == "dual_stream":
    possible = ((qc & kc & causal_any) | (qn & kn & blocks_meet & causal_any)
                | (qn & kc & earlier_any))
    certain = ((qc1 & kc1 & causal_all) | (qn1 & kn1 & one_block & causal_all)
               | (qn1 & kc1 & earlier_all))
  else:  # bd3lm
    possible = ((qn & kn & blocks_meet) | (qn & kc & earlier_any)
                | (qc & kc & (kb[0] <= qb[1])))
    certain = ((qn1 & kn1 & one_block) | (qn1 & kc1 & earlier_all)
               | (qc1 & kc1 & (kb[1] <= qb[0])))
  return possible, certain


@functools.partial(jax.jit, static_argnums=(0, 3, 4))
def tile_classes(spec: MaskSpec, q_meta, k_meta, block_q: int, block_k: int):
  """[b, ceil(Tq / block_q), ceil(Tk / block_k)] int32 of EMPTY / PARTIAL / FULL, on device.

  Conservative (see the module docstring): EMPTY and FULL only where the per-tile bounds
  prove them, so a kernel that masks PARTIAL tiles per element is exact."""
  qs = {name: (lo[:, :, None], hi[:, :, None])
        for name, (lo, hi) in _summaries(q_meta, block_q, spec).items()}
  ks = {name: (lo[:, None, :], hi[:, None, :])
        for name, (lo, hi) in _summaries(k_meta, block_k, spec).items()}
  seg_any = (qs["seg"][0] <= ks["seg"][1]) & (ks["seg"][0] <= qs["seg"][1])
  seg_all = ((qs["seg"][0] == qs["seg"][1]) & (ks["seg"][0] == ks["seg"][1])
             & (qs["seg"][0] == ks["seg"][0]))
  possible, certain = _rule_bounds(spec, qs, ks)
  k_len = k_meta[0].shape[1]
  nk = -(-k_len // block_k)
  k_whole = jnp.arange(nk) < k_len // block_k  # a key tile with length padding is never FULL
  full = seg_all & certain & k_whole
  out = jnp.where(full, FULL, jnp.where(seg_any & possible, PARTIAL, EMPTY))
  return jnp.broadcast_to(out, seg_any.shape[:2] + (nk,)).astype(jnp.int32)


@jax.jit
def visit_table(classes):
  """[b, rows, cols] classes -> [b, rows, W] int32 rows [n_full, n_partial, FULL column
  indices..., PARTIAL column indices..., zeros], W a power of two >= cols + 2."""
  b, rows, cols = classes.shape
  rank = jnp.where(classes == FULL, 0, jnp.where(classes == PARTIAL, 1, 2))
  order = jnp.argsort(rank, axis=-1, stable=True).astype(jnp.int32)
  n_full = jnp.sum(classes == FULL, axis=-1, dtype=jnp.int32)
  n_partial = jnp.sum(classes == PARTIAL, axis=-1, dtype=jnp.int32)
  width = pl.next_power_of_2(cols + 2)
  return jnp.concatenate([n_full[..., None], n_partial[..., None], order,
                          jnp.zeros((b, rows, width - cols - 2), jnp.int32)], axis=-1)


def visit_fractions(classes) -> dict:
  """Shares of tiles skipped (EMPTY), visited without mask (FULL) and masked (PARTIAL)."""
  c = np.asarray(classes)
  return {"skipped": float((c == EMPTY).mean()), "full": float((c == FULL).mean()),
          "partial": float((c == PARTIAL).mean())}
