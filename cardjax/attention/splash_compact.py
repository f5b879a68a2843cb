"""Splash on MARS's compact noisy stream, by scatter and gather.

A compact row (MaskSpec.noisy_len = N > 0) is [clean (L) | the whole blocks that carry
loss, in order, then filler (N)] (cardjax/objectives/mars.py); each kept noisy token has
its clean counterpart's position and segment. Splash's mask is a static function of token
indices, and which blocks a row keeps is data, so the compact row cannot be given to it as
is (cardjax/attention/splash.py). Under splash's layout contract it need not be: there a
segment's positions rise by 1 with the index, so the clean counterpart of the noisy token
(segment s, position p) sits at clean index first(s) - position(first(s)) + p, first(s)
being s's first clean index. `compact_attention`

  1. computes that index for every noisy token (`counterparts`; filler and tokens with no
     counterpart get L, "none"),
  2. scatters the compact noisy q, k, v into an aligned [clean (L) | noisy (L)] row (the
     slots of blocks not kept stay zero; filler is dropped) whose halves share the clean
     stream's segment ids, the row splash's static dual_stream mask describes,
  3. runs splash on it and gathers the kept tokens' outputs back into the compact order
     (filler gives 0, as splash gives padding).

Exact: kept blocks are whole, a noisy query sees noisy keys of its own block only and
clean keys of earlier blocks, and clean queries never see noisy keys, so no kept query
reads a zero slot, and every kept query's keys are the ones the compact row gives it.
Gradients come from autodiff through the two gathers (their transposes scatter-add the
cotangents back; no slot is written twice, so nothing is summed that should not be).

Cost: attention runs on the aligned 2L row, the full noisy copy's attention (never more:
splash still skips every clean -> noisy tile and every noisy tile outside the diagonal
band); only the MLP, the projections and the loss keep the compact saving. The other exact
route, splash's dynamic mask, would store a [T, T] mask per row and head group.
"""

from __future__ import annotations

import collections

import jax
import jax.numpy as jnp
import numpy as np

from cardjax.attention.masks import MaskSpec


def counterparts(spec: MaskSpec, meta) -> jax.Array:
  """[b, N] int32: the clean-stream index of each compact noisy token's clean counterpart
  (same segment, same position), L where it has none (filler, segment 0; or metadata off
  the layout contract, which `layout_problems` names when concrete)."""
  pos, seg = jnp.asarray(meta[0], jnp.int32), jnp.asarray(meta[2], jnp.int32)
  l = pos.shape[1] - spec.noisy_len

  def row(pos, seg):
    pc, sc, pn, sn = pos[:l], seg[:l], pos[l:], seg[l:]
    # Each noisy token's segment's first clean index: a stable sort of the clean ids and a
    # binary search (any id values; a segment_min table would need ids bounded by L).
    order = jnp.argsort(sc, stable=True)
    first = order[jnp.minimum(jnp.searchsorted(sc[order], sn), l - 1)]
    # index - position is constant along a segment under splash's contract.
    idx = first - pc[first] + pn
    at = jnp.clip(idx, 0, l - 1)
    # Only a slot holding the same (segment, position) is the counterpart: off the contract
    # a token is dropped (output 0) rather than reading another token's slot.
    ok = (sn > 0) & (idx >= 0) & (idx < l) & (sc[at] == sn) & (pc[at] == pn)
    return jnp.where(ok, idx, l)

  return jax.vmap(row)(pos, seg)


def _take(x, idx):
  """x [b, S, ...] at idx [b, M] (S: none) -> [b, M, ...], zero where none."""
  size = x.shape[1]
  got = jax.vmap(lambda xr, ir: xr[jnp.minimum(ir, size - 1)])(x, idx)
  return jnp.where((idx < size).reshape(idx.shape + (1,) * (x.ndim - 2)), got, 0)


def compact_attention(attend, q, k, v, spec: MaskSpec, meta):
  """Attention on compact rows (q [b, L + N, h, d], k, v [b, L + N, kvh, d], meta the
  rows' (positions, streams, segment_ids)) through attend(q2, k2, v2, seg2) -> out2, the
  static dual_stream splash on aligned rows [b, 2L, ...] whose halves share segment ids
  seg2 [b, 2L]. Kept noisy tokens and real clean tokens get their attention; filler 0."""
  n = spec.noisy_len
  l = q.shape[1] - n
  idx = counterparts(spec, meta)  # compact noisy token -> aligned noisy slot
  # The inverse map, aligned noisy slot -> compact noisy token (n: none), makes the scatter
  # a gather too. Integer metadata: no gradient flows through it.
  src = jax.vmap(lambda i: jnp.full((l,), n, jnp.int32).at[i].set(
      jnp.arange(n, dtype=jnp.int32), mode="drop"))(idx)

  def aligned(x):
    return jnp.concatenate([x[:, :l], _take(x[:, l:], src)], axis=1)

  seg = jnp.asarray(meta[2], jnp.int32)[:, :l]
  out = attend(aligned(q), aligned(k), aligned(v), jnp.concatenate([seg, seg], axis=1))
  return jnp.concatenate([out[:, :l], _take(out[:, l:], idx)], axis=1)


def layout_problems(spec: MaskSpec, meta) -> list[str]:
  """What keeps concrete compact metadata from its aligned row, beyond the clean stream's
  contract (checked by splash.layout_problems): noisy tokens with no clean counterpart,
  and kept blocks that are not whole; [] if none."""
  pos, seg = np.asarray(meta[0]), np.asarray(meta[2])
  l, b = pos.shape[1] - spec.noisy_len, spec.block_size
  problems = []
  for r in range(pos.shape[0]):
    clean = [(s, p) for s, p in zip(seg[r, :l].tolist(), pos[r, :l].tolist()) if s > 0]
    noisy = [(s, p) for s, p in zip(seg[r, l:].tolist(), pos[r, l:].tolist()) if s > 0]
    present = set(clean)
    lost = [x for x in noisy if x not in present]
    if lost:
      problems.append(f"row {r}: {len(lost)} noisy token(s) have no clean token of the same "
                      f"segment and position (first: segment {lost[0][0]}, position "
                      f"{lost[0][1]})")
    whole = collections.Counter((s, p // b) for s, p in clean)
    kept = collections.Counter((s, p // b) for s, p in noisy)
    for (s, blk), count in kept.items():
      if count != whole[(s, blk)]:
        problems.append(f"row {r}: the noisy stream keeps {count} of the {whole[(s, blk)]} "
                        f"tokens of block {blk} (positions {blk * b}..{blk * b + b - 1}) of "
                        f"segment {s}; the compact stream must keep whole blocks")
        break
  return problems
