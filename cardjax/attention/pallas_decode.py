"""Flash-decoding attention over the KV cache for GPUs: a Pallas kernel for the Triton lowering.

  pallas_decode_attention(q, k, v, spec, q_meta, k_meta)   same contract as cache_attention
  unsupported_reason(spec, q_len, slots, head_dim)         None, or why not and what to do

A few queries (an AR step, a MARS window, a prefill) attend over the cache's slots, which
are read where they lie: k, v [batch, kv_heads, slots, head_dim], never padded, copied or
transposed; the last, partial key tile is a masked load.

GQA folding: one program serves all g = heads // kv_heads query heads of a kv head. Its
rows are the g x tq (query, head) pairs, query-major (row = t * g + head), padded to a
power of two >= 16 (Triton's smallest dot) and cut into row tiles of at most BLOCK_R rows,
so each key tile is loaded once per kv head and row tile, not once per query head.

Tiling: grid (batch, kv_heads, row tiles, splits). A program walks its key tiles of block_k
slots with an online softmax in float32. Flash-decoding's split: when batch x kv_heads x
row tiles is too few programs to fill the GPU, each row tile's key range is cut into
`splits` equal parts that run in parallel and write float32 (acc, max, sum) partials,
merged by a small XLA epilogue; with one split the kernel writes the output itself.

Skipping: a jnp pre-pass (`key_tile_ranges`, O(batch x row tiles x slots) on device, since
the cache metadata is traced) gives every (batch row, row tile) the key-tile range
[first, end) between the first and the last slot that some query of the tile may see:
the slot's segment lies in the tile's segment range (so empty slots, segment -1, and the
left padding of real-query tiles drop out), and, by the mask kind, its position (causal,
dual_stream) or block (bd3lm, block_causal) is at most the tile's largest. These bounds
are conservative, so every visible key lies inside the range and the kernel, which masks
each tile it loads per element with MaskSpec.allowed, stays exact for any metadata; it
never loads a tile outside the range: the empty tail of the cache, the left padding, the
causal upper part of a prefill. Empty tiles inside the range (a gap) are still loaded.

Zero-row guard: masked scores are -inf and the running max is replaced by 0 while it is
still -inf, so a row with no visible key accumulates nothing and returns 0, no NaN (the
dense reference returns the mean of v there; the two agree on every row that sees a key).

Versions: written for jax 0.10 (tested with 0.10.2) against `jax.experimental.pallas.triton`,
as pallas_gpu.py is (plgpu.CompilerParams, plus plgpu.load with mask/other for the partial
tile; deprecated upstream in favour of Mosaic GPU). Off GPU it runs with interpret=True
(the default there); `pallas_gpu.lower_for_gpu` checks the Triton lowering without a GPU
(tests/test_pallas_decode.py does). Not yet run on a GPU.
"""

from __future__ import annotations

import functools

import jax
import jax.numpy as jnp
from jax import lax
from jax.experimental import pallas as pl
from jax.experimental.pallas import triton as plgpu

from cardjax.attention.kernel_checks import call_reason, check_inputs
from cardjax.attention.masks import MaskSpec
from cardjax.attention.pallas_common import HEAD_DIMS, MIN_BLOCK, NUM_STAGES, dot, pow2_block
from cardjax.attention.pallas_gpu_fit import settle_tiles, target_gpu

# 64 x 64 tiles: q, the f32 accumulator and one k/v tile fit in registers for head_dim 128
# (as pallas_gpu's forward); a decode step's few rows are padded to 16 only, not to 64.
BLOCK_R, BLOCK_K = 64, 64
# Splits are added until about two programs per SM of an H100/H200 (132 SMs) run, but a
# split keeps >= 4 key tiles so its set-up and the merge stay small next to its loads.
TARGET_PROGRAMS, MIN_TILES_PER_SPLIT = 256, 4


def unsupported_reason(spec, q_len: int, slots: int, head_dim: int) -> str | None:
  """None when the kernel serves this call; else one line saying why not and the fix."""
  reason = call_reason(spec, q_len, slots, cache_layout=True)
  if reason:
    return reason
  if head_dim not in HEAD_DIMS:
    return (f"head_dim {head_dim} is not one of {HEAD_DIMS} (Triton tiles need a power of "
            f"two >= 16; larger dims overflow registers); use xla's cache_attention")
  return None


def num_warps(block_r: int, head_dim: int) -> int:
  """More warps once the row tile holds a 64 x 128 block of q (a prefill at head_dim 128)."""
  return 8 if block_r * head_dim >= 64 * 128 else 4


def _fold_meta(q_meta, group: int, rows_p: int):
  """Query metadata per folded row (row = t * group + head), [b, rows_p]. The padding
  rows repeat the last real row: they widen no bound of key_tile_ranges (their outputs
  are dropped)."""
  out = []
  for x in q_meta:
    x = jnp.repeat(x.astype(jnp.int32), group, axis=1)
    out.append(jnp.pad(x, ((0, 0), (0, rows_p - x.shape[1])), mode="edge"))
  return out


def key_tile_ranges(spec: MaskSpec, q_meta, k_meta, group: int, block_r: int, block_k: int):
  """[b, row tiles, 2] int32 (first, end) key tiles per row tile that may hold a visible
  key; end <= first when none can. Conservative: see the module docstring."""
  b, tq = q_meta[0].shape
  slots = k_meta[0].shape[1]
  nr = -(-tq * group // block_r)
  qp, _, qg = (x.reshape(b, nr, block_r) for x in _fold_meta(q_meta, group, nr * block_r))
  kp, kg = (x.astype(jnp.int32)[:, None, :] for x in (k_meta[0], k_meta[2]))
  ok = (kg >= qg.min(-1, keepdims=True)) & (kg <= qg.max(-1, keepdims=True))
  pos_hi = qp.max(-1, keepdims=True)
  if spec.kind in ("causal", "dual_stream"):  # every rule of these implies k_pos <= q_pos
    ok &= kp <= pos_hi
  elif spec.kind != "bidirectional":  # bd3lm, block_causal: k_blk <= q_blk (floor: monotone)
    ok &= kp // spec.block_size <= pos_hi // spec.block_size
  slot = jnp.arange(slots, dtype=jnp.int32)
  first = jnp.min(jnp.where(ok, slot, slots), axis=-1) // block_k
  end = -(-jnp.max(jnp.where(ok, slot + 1, 0), axis=-1) // block_k)
  return jnp.stack([first, end], axis=-1).astype(jnp.int32)


def _kernel(range_ref, q_ref, k_ref, v_ref, qp_ref, qs_ref, qg_ref, kp_ref, ks_ref, kg_ref,
            *out_refs, spec, scale, block_k, slots, splits):
  q = q_ref[...]
  qp, qs, qg = qp_ref[...], qs_ref[...], qg_ref[...]
  first, end = range_ref[0], range_ref[1]
  # The range is cut at run time, so the splits share the tiles this row tile really reads.
  per = jnp.maximum(end - first + splits - 1, 0) // splits
  lo = first + pl.program_id(3) * per
  hi = jnp.minimum(lo + per, end)

  def body(tile, carry):
    acc, m, l = carry
    start = pl.multiple_of(tile * block_k, block_k)
    keys = pl.ds(start, block_k)
    # The cache is not padded to whole tiles: slots past its end are never read.
    inside = start + lax.broadcasted_iota(jnp.int32, (block_k,), 0) < slots
    k = plgpu.load(k_ref.at[keys, :], mask=inside[:, None], other=0.0)
    v = plgpu.load(v_ref.at[keys, :], mask=inside[:, None], other=0.0)
    kp, ks, kg = (plgpu.load(r.at[keys], mask=inside, other=0) for r in (kp_ref, ks_ref, kg_ref))
    ok = spec.allowed(qp[:, None], kp[None, :], qs[:, None], ks[None, :], qg[:, None],
                      kg[None, :]) & inside[None, :]
    s = jnp.where(ok, dot(q, k, trans_b=True) * scale, -jnp.inf)
    m_new = jnp.maximum(m, jnp.max(s, axis=1))
    # While a row has seen no visible key its max is -inf; subtracting 0 instead keeps
    # exp(-inf - 0) = 0 rather than exp(-inf + inf) = NaN.
    m_safe = jnp.where(m_new == -jnp.inf, 0.0, m_new)
    p = jnp.exp(s - m_safe[:, None])
    alpha = jnp.exp(m - m_safe)
    acc = acc * alpha[:, None] + dot(p.astype(v.dtype), v)
    return acc, m_new, l * alpha + jnp.sum(p, axis=1)

  rows, d = q.shape
  init = (jnp.zeros((rows, d), jnp.float32), jnp.full((rows,), -jnp.inf, jnp.float32),
          jnp.zeros((rows,), jnp.float32))
  acc, m, l = lax.fori_loop(lo, hi, body, init)
  if splits == 1:  # l == 0 exactly when nothing was visible: those rows give 0
    out_refs[0][...] = (acc / jnp.where(l == 0.0, 1.0, l)[:, None]).astype(out_refs[0].dtype)
  else:
    for ref, x in zip(out_refs, (acc, m, l)):
      ref[...] = x


def _merge(acc, m, l):
  """The splits' partials [b, kvh, S, rows(, d)] -> the normalised [b, kvh, rows, d]."""
  top = jnp.max(m, axis=2, keepdims=True)
  w = jnp.exp(m - jnp.where(top == -jnp.inf, 0.0, top))  # a split that saw nothing: 0
  total = jnp.sum(w * l, axis=2)
  return jnp.sum(w[..., None] * acc, axis=2) / jnp.where(total == 0.0, 1.0, total)[..., None]


def pallas_decode_attention(q, k, v, spec: MaskSpec, q_meta, k_meta, *, interpret=None,
                            block_k=None, scale=None, num_splits=None):
  """Attention of a few queries over the KV cache; the contract of cache_attention.

  q [b, tq, heads, d]; k, v [b, kv_heads, slots, d] (the cache's layout, read in place);
  q_meta / k_meta (positions, streams, segments), [b, tq] / [b, slots] integer. Returns
  [b, tq, heads, d] in q's dtype (float32 softmax and accumulation); rows with no visible
  key return 0. interpret: the Pallas interpreter (None: unless the backend is a GPU).
  block_k: key tile (a power of two >= 16; None: 64, shrunk for small caches; compiled
  for a GPU pallas_gpu_fit knows, halved until it fits the GPU's shared memory, and an
  explicit one that cannot fit raises CardjaxError, see pallas_gpu_attention). scale:
  None for head_dim ** -0.5. num_splits: parallel parts of each key range (None: enough
  to fill a GPU, see TARGET_PROGRAMS). Forward only.
  """
  q_meta, k_meta = (tuple(jnp.asarray(x) for x in m) for m in (q_meta, k_meta))
  check_inputs(q, k, v, spec, q_meta, k_meta, kernel="pallas_decode_attention", cache_layout=True,
               unsupported=unsupported_reason)
  if interpret is None:
    interpret = jax.default_backend() != "gpu"
  b, tq, h, d = q.shape
  kvh, slots = k.shape[1], k.shape[2]
  g = h // kvh
  block_r, block_k = settle_tiles(
      ("decode",), max(MIN_BLOCK, min(BLOCK_R, pl.next_power_of_2(tq * g))),
      pow2_block(block_k, BLOCK_K, slots), gpu=None if interpret else target_gpu(q),
      kind=spec.kind, explicit=block_k is not None, head_dim=d,
      dtype=q.dtype, num_warps=lambda r, _: num_warps(r, d),
      names=("the row tile", "block_k"), num_stages=NUM_STAGES)
  nr, nk = -(-tq * g // block_r), -(-slots // block_k)
  if num_splits is None:
    num_splits = max(1, min(nk // MIN_TILES_PER_SPLIT, -(-TARGET_PROGRAMS // (b * kvh * nr))))
  elif num_splits < 1:
    raise ValueError(f"num_splits={num_splits} must be >= 1 (or None for the default)")
  ranges = key_tile_ranges(spec, q_meta, k_meta, g, block_r, block_k)
  rows_p = nr * block_r
  # Only the small query side is reshaped: [b, tq, kvh, g, d] -> [b, kvh, tq * g, d].
  qf = q.reshape(b, tq, kvh, g, d).transpose(0, 2, 1, 3, 4).reshape(b, kvh, tq * g, d)
  qf = jnp.pad(qf, ((0, 0), (0, 0), (0, rows_p - tq * g), (0, 0)))
  qm = _fold_meta(q_meta, g, rows_p)
  km = [x.astype(jnp.int32) for x in k_meta]
  kernel = functools.partial(_kernel, spec=spec, scale=d ** -0.5 if scale is None else scale,
                             block_k=block_k, slots=slots, splits=num_splits)
  rows_spec = pl.BlockSpec((None, None, block_r, d), lambda i, n, r, s: (i, n, r, 0))
  if num_splits == 1:
    out_specs = [rows_spec]
    out_shape = [jax.ShapeDtypeStruct((b, kvh, rows_p, d), q.dtype)]
  else:
    part = (b, kvh, num_splits, rows_p)
    out_specs = [pl.BlockSpec((None, None, None, block_r, d), lambda i, n, r, s: (i, n, s, r, 0))]
    out_specs += [pl.BlockSpec((None, None, None, block_r), lambda i, n, r, s: (i, n, s, r))] * 2
    out_shape = [jax.ShapeDtypeStruct(part + (d,), jnp.float32)]
    out_shape += [jax.ShapeDtypeStruct(part, jnp.float32)] * 2
  kv_spec = pl.BlockSpec((None, None, slots, d), lambda i, n, r, s: (i, n, 0, 0))
  outs = pl.pallas_call(
      kernel,
      grid=(b, kvh, nr, num_splits),
      in_specs=[pl.BlockSpec((None, None, 2), lambda i, n, r, s: (i, r, 0)), rows_spec,
                kv_spec, kv_spec]
               + [pl.BlockSpec((None, block_r), lambda i, n, r, s: (i, r))] * 3
               + [pl.BlockSpec((None, slots), lambda i, n, r, s: (i, 0))] * 3,
      out_specs=out_specs,
      out_shape=out_shape,
      compiler_params=plgpu.CompilerParams(num_warps=num_warps(block_r, d),
                                           num_stages=NUM_STAGES),
      interpret=bool(interpret),
      name="cardjax_flash_decoding" if num_splits == 1 else "cardjax_flash_decoding_split",
  )(ranges, qf, k, v, *qm, *km)
  out = outs[0] if num_splits == 1 else _merge(*outs).astype(q.dtype)
  out = out[:, :, :tq * g].reshape(b, kvh, tq, g, d).transpose(0, 2, 1, 3, 4)
  return out.reshape(b, tq, h, d)
