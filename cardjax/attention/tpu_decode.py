"""Flash-decoding attention over the KV cache for TPUs: a Pallas kernel for the Mosaic lowering.

  tpu_decode_attention(q, k, v, spec, q_meta, k_meta)   same contract as cache_attention
  unsupported_reason(spec, q_len, slots, head_dim)      None, or why not and what to do

The TPU counterpart of pallas_decode.py (GPU): a few queries (an AR step, a MARS window, a
prefill) attend over the cache's k, v [batch, kv_heads, slots, head_dim], read where they
lie (no padding, copy or transpose of the cache; the last, partial key tile's slots past
the end are masked, their values zeroed).

GQA folding: one program serves all g = heads // kv_heads query heads of a kv head: its
rows are the g x tq (query, head) pairs, query-major, padded to a multiple of 8 (a TPU
sublane tile), so each key tile is fetched once per kv head, not once per query head.

Grid (batch, kv_heads, key tiles of BLOCK_K = 128 slots, a lane tile); the key axis is
sequential ("arbitrary"): an online softmax in float32 VMEM scratch (running max, sum,
accumulator), set up at the first key tile and written out at the last.

Skipping: the per-row key-tile range [first, end) of pallas_decode.key_tile_ranges (the
same conservative bounds: the cache's empty tail, the left padding and the causal upper
part of a prefill lie outside it) is scalar-prefetched into SMEM. The k/v index maps clamp
the tile index into the range, so a step outside it names the block already in VMEM and
Pallas issues no copy for it; `pl.when` skips its compute. Inside the range every loaded
tile is masked per element with MaskSpec.allowed, so the result is exact for any metadata.

Zero-row guard as pallas_decode: a row with no visible key returns 0, no NaN.

Versions: written for jax 0.10 (tested with 0.10.2) against `jax.experimental.pallas.tpu`;
off TPU it runs with interpret=True (the default there), and libtpu's compile-only TPU
devices compile it from a CPU process (tests/test_tpu_decode.py). Not yet run on a TPU.
Selected (select.cached_choose) for head_dim 128 and 256 only: with 64 a call relays the
cache into the kernel's (8, 128) tiles first (docs/attention.md).
"""

from __future__ import annotations

import functools

import jax
import jax.numpy as jnp
from jax import lax
from jax.experimental import pallas as pl
from jax.experimental.pallas import tpu as pltpu

from cardjax.attention.kernel_checks import call_reason, check_inputs
from cardjax.attention.masks import MaskSpec
from cardjax.attention.pallas_decode import _fold_meta, key_tile_ranges

BLOCK_K = 128  # key slots per tile: one lane tile of the scores
ROWS = 8  # folded query rows are padded to a multiple of this (a sublane tile)
HEAD_DIMS = (64, 128, 256)


def unsupported_reason(spec, q_len: int, slots: int, head_dim: int) -> str | None:
  """None when the kernel serves this call; else one line saying why not and the fix."""
  reason = call_reason(spec, q_len, slots, cache_layout=True)
  if reason:
    return reason
  if head_dim not in HEAD_DIMS:
    return (f"head_dim {head_dim} is not one of {HEAD_DIMS} (a TPU kernel's last dim is a "
            "multiple of its 128 lanes, or 64); use xla's cache_attention")
  return None


def _kernel(ranges_ref, q_ref, k_ref, v_ref, qp_ref, qs_ref, qg_ref, kp_ref, ks_ref, kg_ref,
            o_ref, m_ref, l_ref, acc_ref, *, spec, scale, slots, tiles):
  i, tile = pl.program_id(0), pl.program_id(2)
  first, end = ranges_ref[2 * i], ranges_ref[2 * i + 1]

  @pl.when(tile == 0)
  def _init():
    m_ref[...] = jnp.full(m_ref.shape, -jnp.inf, jnp.float32)
    l_ref[...] = jnp.zeros(l_ref.shape, jnp.float32)
    acc_ref[...] = jnp.zeros(acc_ref.shape, jnp.float32)

  @pl.when((tile >= first) & (tile < end))
  def _visit():
    slot = tile * BLOCK_K + lax.broadcasted_iota(jnp.int32, (1, BLOCK_K), 1)
    inside = slot < slots  # [1, BLOCK_K]: the partial last tile's tail is not the cache's
    ok = spec.allowed(qp_ref[...], kp_ref[...], qs_ref[...], ks_ref[...], qg_ref[...],
                      kg_ref[...]) & inside
    s = lax.dot_general(q_ref[...], k_ref[...], (((1,), (1,)), ((), ())),
                        preferred_element_type=jnp.float32) * scale
    s = jnp.where(ok, s, -jnp.inf)
    m = m_ref[...]
    m_new = jnp.maximum(m, jnp.max(s, axis=1, keepdims=True))
    # While a row has seen no visible key its max is -inf: subtract 0 there, not -inf.
    m_safe = jnp.where(m_new == -jnp.inf, 0.0, m_new)
    p = jnp.exp(s - m_safe)
    alpha = jnp.exp(m - m_safe)
    v = v_ref[...]
    # Values past the cache's end are whatever the padded block holds (maybe NaN): 0 * NaN
    # would poison the row, so they are zeroed, not only given zero weight.
    column = tile * BLOCK_K + lax.broadcasted_iota(jnp.int32, (BLOCK_K, 1), 0) < slots
    v = jnp.where(column, v, jnp.zeros_like(v))
    acc_ref[...] = acc_ref[...] * alpha + jnp.dot(p.astype(v.dtype), v,
                                                  preferred_element_type=jnp.float32)
    l_ref[...] = l_ref[...] * alpha + jnp.sum(p, axis=1, keepdims=True)
    m_ref[...] = m_new

  @pl.when(tile == tiles - 1)
  def _write():
    l = l_ref[...]  # 0 exactly when nothing was visible: those rows give 0
    o_ref[...] = (acc_ref[...] / jnp.where(l == 0.0, 1.0, l)).astype(o_ref.dtype)


def tpu_decode_attention(q, k, v, spec: MaskSpec, q_meta, k_meta, *, interpret=None,
                         scale=None):
  """Attention of a few queries over the KV cache; the contract of cache_attention.

  q [b, tq, heads, d]; k, v [b, kv_heads, slots, d] (the cache's layout, read in place);
  q_meta / k_meta (positions, streams, segments), [b, tq] / [b, slots] integer. Returns
  [b, tq, heads, d] in q's dtype (float32 softmax and accumulation); rows with no visible
  key return 0. interpret: the Pallas interpreter (None: unless the backend is a TPU).
  scale: None for head_dim ** -0.5. Forward only.
  """
  q_meta, k_meta = (tuple(jnp.asarray(x) for x in m) for m in (q_meta, k_meta))
  check_inputs(q, k, v, spec, q_meta, k_meta, kernel="tpu_decode_attention",
               cache_layout=True, unsupported=unsupported_reason)
  if interpret is None:
    interpret = jax.default_backend() != "tpu"
  b, tq, h, d = q.shape
  kvh, slots = k.shape[1], k.shape[2]
  g = h // kvh
  rows = -(-tq * g // ROWS) * ROWS
  tiles = -(-slots // BLOCK_K)
  # One row tile holds every folded row: its range is the union of theirs.
  ranges = key_tile_ranges(spec, q_meta, k_meta, g, rows, BLOCK_K)[:, 0].reshape(-1)
  qf = q.reshape(b, tq, kvh, g, d).transpose(0, 2, 1, 3, 4).reshape(b, kvh, tq * g, d)
  qf = jnp.pad(qf, ((0, 0), (0, 0), (0, rows - tq * g), (0, 0)))
  qm = [x[:, :, None] for x in _fold_meta(q_meta, g, rows)]  # [b, rows, 1]: a column
  km = [x.astype(jnp.int32)[:, None, :] for x in k_meta]  # [b, 1, slots]: a row

  def visited(i, t, ranges):  # a tile outside the row's range names one inside it
    first, end = ranges[2 * i], ranges[2 * i + 1]
    last = jnp.minimum(jnp.maximum(end - 1, first), tiles - 1)
    return jnp.minimum(jnp.maximum(t, first), last)

  def kv_map(i, n, t, ranges):
    return i, n, visited(i, t, ranges), 0

  def key_map(i, n, t, ranges):
    return i, 0, visited(i, t, ranges)

  rows_spec = pl.BlockSpec((None, None, rows, d), lambda i, n, t, r: (i, n, 0, 0))
  kv_spec = pl.BlockSpec((None, None, BLOCK_K, d), kv_map)
  grid_spec = pltpu.PrefetchScalarGridSpec(
      num_scalar_prefetch=1,
      grid=(b, kvh, tiles),
      in_specs=[rows_spec, kv_spec, kv_spec]
               + [pl.BlockSpec((None, rows, 1), lambda i, n, t, r: (i, 0, 0))] * 3
               + [pl.BlockSpec((None, 1, BLOCK_K), key_map)] * 3,
      out_specs=rows_spec,
      scratch_shapes=[pltpu.VMEM((rows, 1), jnp.float32), pltpu.VMEM((rows, 1), jnp.float32),
                      pltpu.VMEM((rows, d), jnp.float32)])
  kernel = functools.partial(_kernel, spec=spec, scale=d ** -0.5 if scale is None else scale,
                             slots=slots, tiles=tiles)
  out = pl.pallas_call(
      kernel,
      grid_spec=grid_spec,
      out_shape=jax.ShapeDtypeStruct((b, kvh, rows, d), q.dtype),
      compiler_params=pltpu.CompilerParams(
          dimension_semantics=("parallel", "parallel", "arbitrary")),
      interpret=bool(interpret),
      name="cardjax_tpu_flash_decoding",
  )(ranges, qf, k, v, *qm, *km)
  out = out[:, :, :tq * g].reshape(b, kvh, tq, g, d).transpose(0, 2, 1, 3, 4)
  return out.reshape(b, tq, h, d)
