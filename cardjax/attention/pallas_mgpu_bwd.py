"""The backward of the Hopper attention forward (pallas_mgpu.py): a dq kernel and a dk/dv
kernel for the Mosaic GPU lowering.

  mgpu_backward(q, k, v, spec, q_meta, k_meta, out, lse, d_out) -> (dq, dk, dv)

Both recompute a visited tile's probabilities from the forward's logsumexp,
p = exp2(s * scale * log2 e - lse * log2 e), rather than storing them, as FlashAttention's
backward does; delta = rowsum(out * d_out) is one jnp pre-pass:

  dq kernel     a CTA of 128 query rows (two compute warpgroups of 64) walks the forward's
                visit table (128 queries x 64 keys); per key tile s = q k^T, dp = do v^T,
                ds = p * (dp - delta), dq += ds k;
  dk/dv kernel  a CTA of 128 keys (two compute warpgroups of 64) walks the TRANSPOSED
                table (per key CTA, the 64-row query tiles that see it); per query tile
                s^T = k q^T, dp^T = v do^T, dv += p^T do, dk += ds^T q.

In each, a third (memory) warpgroup streams the walked tiles into shared memory with TMA,
STAGES ahead, and waits on a "free" barrier that both compute warpgroups arrive on when a
slot's last product is done. FULL tiles skip the mask, PARTIAL tiles zero the masked
probabilities with MaskSpec's rule on the streamed metadata, EMPTY tiles are never loaded.
Query rows that saw no key carry lse = +inf, so their p is exactly 0; so do the rows that
only pad the length (their lse is set to +inf here, whatever the forward wrote).

Every product takes its right-hand operand from shared memory untransposed, so the
transposed operands (k^T, v^T for dq; q^T, do^T for dk/dv) are copies made before the
kernel: Mosaic GPU's CPU interpreter has no transposed shared-memory views, and one code
path for both modes is what the interpreter checks. The left-hand p^T and ds come from
registers when compiled (register_ds) and through shared memory in the interpreter.

GQA: the dk/dv kernel runs per QUERY head and writes [b, tk, heads, d] partials in the
input dtype, which one float32 sum folds into the kv heads (as jax's own Hopper backward).
"""

from __future__ import annotations

import functools

import jax
import jax.numpy as jnp
from jax import lax
from jax.experimental import pallas as pl
from jax.experimental.pallas import mosaic_gpu as plgpu

from cardjax.attention.device_tiles import tile_classes, visit_table
from cardjax.attention.masks import MaskSpec
from cardjax.attention.pallas_common import pad_len
from cardjax.attention.pallas_mgpu import (BLOCK_K, BLOCK_Q, LOG2E, META, PAD_K_SEG,
                                           PAD_Q_SEG, STAGES, TILED, _COL, _ROW,
                                           interpret_params, layout_cast, packed_meta,
                                           settle_mode)


def _product(lhs, rhs, shape):
  """lhs @ rhs into a fresh fp32 accumulator (the interpreter has no run_state, so sums
  over tiles are added in registers after)."""
  def body(acc_ref):
    plgpu.wgmma(acc_ref, lhs, rhs)
    return acc_ref[...]
  return pl.run_scoped(body, plgpu.ACC(shape, jnp.float32))


def _load_own(pairs, ready, wg):
  """TMA-copy each (gmem, smem) pair of this warpgroup and wait for all of them."""
  for i, (src, dst) in enumerate(pairs):
    plgpu.copy_gmem_to_smem(src, dst, ready.at[2 * i + wg])
  for i in range(len(pairs)):
    plgpu.barrier_wait(ready.at[2 * i + wg])


def _stream(table_ref, row, fetch, free, stages):
  """The memory warpgroup: fetch(step, slot) for every visit of the table row, `stages`
  ahead, each slot refilled once both compute warpgroups have freed it. The last slots'
  releases are waited out too, so every barrier phase is observed (the interpreter checks
  it; on the GPU this warpgroup has nothing else to do)."""
  plgpu.set_max_registers(40, action="decrease")
  n_visits = table_ref[row + (0,)] + table_ref[row + (1,)]
  for i in range(stages):
    pl.when(i < n_visits)(functools.partial(fetch, jnp.int32(i), i))

  @pl.loop(0, jnp.maximum(n_visits - stages, 0))
  def _(done):
    slot = lax.rem(done, jnp.asarray(stages, done.dtype))
    plgpu.barrier_wait(free.at[slot])
    fetch(done + stages, slot)

  @pl.loop(jnp.maximum(n_visits - stages, 0), n_visits)
  def _(done):
    plgpu.barrier_wait(free.at[lax.rem(done, jnp.asarray(stages, done.dtype))])


def _walk(table_ref, row, visit, carry):
  """FULL tiles without the mask, then PARTIAL tiles with it."""
  n_full = table_ref[row + (0,)]
  carry = lax.fori_loop(0, n_full, functools.partial(visit, masked=False), carry)
  return lax.fori_loop(n_full, n_full + table_ref[row + (1,)],
                       functools.partial(visit, masked=True), carry)


def _meta(ref, layout, axis, shape, cast):
  """The four metadata rows of a tile, broadcast along `axis` of the score tile."""
  return [lax.broadcast_in_dim(cast(ref[i], layout), shape, [axis]) for i in range(META)]


def _dq_kernel(table_ref, q_ref, do_ref, lse_ref, delta_ref, qm_ref, kt_ref, vt_ref, k_ref,
               km_ref, dq_ref, scoped, *, spec, scale, group, register_ds, interpret):
  (q2, do2, lse2, delta2, qm2, kt_smem, vt_smem, k_smem, km_smem, ds2), (own, ready, free) = (
      scoped)
  batch, head = lax.axis_index("batch"), lax.axis_index("heads")
  q_tile, wg = lax.axis_index("q_seq"), lax.axis_index("wg")
  row = (batch, q_tile)
  block_q, head_dim = q2.shape[1:]
  block_k = k_smem.shape[1]
  dtype = q2.dtype
  cast = layout_cast(interpret)

  @pl.when(wg < 2)
  def _compute():
    plgpu.set_max_registers(232, action="increase")
    q_smem, do_smem, lse_smem, delta_smem, qm_smem = (x.at[wg] for x in (q2, do2, lse2,
                                                                          delta2, qm2))
    base = q_tile * (2 * block_q) + wg * block_q
    rows = (batch, pl.ds(base, block_q), head)
    stats = (batch, head, pl.ds(base, block_q))
    _load_own([(q_ref.at[rows], q_smem), (do_ref.at[rows], do_smem),
               (lse_ref.at[stats], lse_smem), (delta_ref.at[stats], delta_smem),
               (qm_ref.at[batch, :, pl.ds(base, block_q)], qm_smem)], own, wg)
    shape = (block_q, block_k)
    lse = lax.broadcast_in_dim(cast(lse_smem[...], _ROW), shape, [0])
    delta = lax.broadcast_in_dim(cast(delta_smem[...], _ROW), shape, [0])
    q_meta = _meta(qm_smem, _ROW, 0, shape, cast)

    def visit(step, dq, masked: bool):
      slot = lax.rem(step, jnp.asarray(STAGES, step.dtype))
      for r in ready:
        plgpu.barrier_wait(r.at[slot])
      s = _product(q_smem, kt_smem.at[slot], shape)
      dp = _product(do_smem, vt_smem.at[slot], shape)
      p = jnp.exp2(s * (scale * LOG2E) - lse)
      if masked:
        (qp, qb, qs, qg), (kp, kb, ks, kg) = q_meta, _meta(km_smem.at[slot], _COL, 1, shape,
                                                            cast)
        p = jnp.where(spec.allowed_in_blocks(qp, kp, qb, kb, qs, ks, qg, kg), p, 0.0)
      ds = (p * (dp - delta)).astype(dtype)
      if not register_ds:
        ds2.at[wg][...] = ds
        plgpu.commit_smem()
      update = _product(ds if register_ds else ds2.at[wg], k_smem.at[slot],
                        (block_q, head_dim))
      plgpu.barrier_arrive(free.at[slot])
      return dq + update

    dq = _walk(table_ref, row, visit,
               cast(jnp.zeros((block_q, head_dim), jnp.float32), plgpu.Layout.WGMMA))
    q_smem[...] = (dq * scale).astype(dtype)
    plgpu.commit_smem()
    plgpu.copy_smem_to_gmem(q_smem, dq_ref.at[rows])
    plgpu.wait_smem_to_gmem(0)

  @pl.when(wg == 2)
  def _memory():
    kv_head = lax.div(head, jnp.asarray(group, head.dtype))

    def fetch(step, slot):
      keys = pl.ds(table_ref[batch, q_tile, 2 + step] * block_k, block_k)
      for src, dst, bar in ((kt_ref.at[batch, kv_head, :, keys], kt_smem, ready[0]),
                            (vt_ref.at[batch, kv_head, :, keys], vt_smem, ready[1]),
                            (k_ref.at[batch, keys, kv_head], k_smem, ready[2]),
                            (km_ref.at[batch, :, keys], km_smem, ready[3])):
        plgpu.copy_gmem_to_smem(src, dst.at[slot], bar.at[slot])

    _stream(table_ref, row, fetch, free, STAGES)


def _dkv_kernel(table_ref, k_ref, v_ref, km_ref, q_ref, qt_ref, do_ref, dot_ref, lse_ref,
                delta_ref, qm_ref, dk_ref, dv_ref, scoped, *, spec, scale, group, register_ds,
                interpret):
  ((k2, v2, km2, q_smem, qt_smem, do_smem, dot_smem, lse_smem, delta_smem, qm_smem, pt2, ds2),
   (own, ready, free)) = scoped
  batch, head = lax.axis_index("batch"), lax.axis_index("heads")
  k_tile, wg = lax.axis_index("kv_seq"), lax.axis_index("wg")
  row = (batch, k_tile)
  block_k, head_dim = k2.shape[1:]
  block_q = q_smem.shape[1]
  dtype = k2.dtype
  cast = layout_cast(interpret)

  @pl.when(wg < 2)
  def _compute():
    plgpu.set_max_registers(232, action="increase")
    k_smem, v_smem, km_smem = (x.at[wg] for x in (k2, v2, km2))
    base = k_tile * (2 * block_k) + wg * block_k
    kv_head = lax.div(head, jnp.asarray(group, head.dtype))
    keys = (batch, pl.ds(base, block_k), kv_head)
    _load_own([(k_ref.at[keys], k_smem), (v_ref.at[keys], v_smem),
               (km_ref.at[batch, :, pl.ds(base, block_k)], km_smem)], own, wg)
    shape = (block_k, block_q)  # keys down, queries across
    k_meta = _meta(km_smem, _ROW, 0, shape, cast)

    def visit(step, carry, masked: bool):
      dk, dv = carry
      slot = lax.rem(step, jnp.asarray(STAGES, step.dtype))
      for r in ready:
        plgpu.barrier_wait(r.at[slot])
      st = _product(k_smem, qt_smem.at[slot], shape)
      dpt = _product(v_smem, dot_smem.at[slot], shape)
      lse = lax.broadcast_in_dim(cast(lse_smem[slot], _COL), shape, [1])
      delta = lax.broadcast_in_dim(cast(delta_smem[slot], _COL), shape, [1])
      pt = jnp.exp2(st * (scale * LOG2E) - lse)
      if masked:
        (kp, kb, ks, kg), (qp, qb, qs, qg) = k_meta, _meta(qm_smem.at[slot], _COL, 1, shape,
                                                            cast)
        pt = jnp.where(spec.allowed_in_blocks(qp, kp, qb, kb, qs, ks, qg, kg), pt, 0.0)
      dst = (pt * (dpt - delta)).astype(dtype)
      pt = pt.astype(dtype)
      if not register_ds:
        pt2.at[wg][...] = pt
        ds2.at[wg][...] = dst
        plgpu.commit_smem()
      out_shape = (block_k, head_dim)
      dv_up = _product(pt if register_ds else pt2.at[wg], do_smem.at[slot], out_shape)
      dk_up = _product(dst if register_ds else ds2.at[wg], q_smem.at[slot], out_shape)
      plgpu.barrier_arrive(free.at[slot])
      return dk + dk_up, dv + dv_up

    zeros = cast(jnp.zeros((block_k, head_dim), jnp.float32), plgpu.Layout.WGMMA)
    dk, dv = _walk(table_ref, row, visit, (zeros, zeros))
    k_smem[...] = (dk * scale).astype(dtype)
    v_smem[...] = dv.astype(dtype)
    plgpu.commit_smem()
    out_rows = (batch, pl.ds(base, block_k), head)
    plgpu.copy_smem_to_gmem(k_smem, dk_ref.at[out_rows])
    plgpu.copy_smem_to_gmem(v_smem, dv_ref.at[out_rows])
    plgpu.wait_smem_to_gmem(0)

  @pl.when(wg == 2)
  def _memory():
    def fetch(step, slot):
      rows = pl.ds(table_ref[batch, k_tile, 2 + step] * block_q, block_q)
      for src, dst, bar in ((q_ref.at[batch, rows, head], q_smem, ready[0]),
                            (qt_ref.at[batch, head, :, rows], qt_smem, ready[1]),
                            (do_ref.at[batch, rows, head], do_smem, ready[2]),
                            (dot_ref.at[batch, head, :, rows], dot_smem, ready[3]),
                            (lse_ref.at[batch, head, rows], lse_smem, ready[4]),
                            (delta_ref.at[batch, head, rows], delta_smem, ready[5]),
                            (qm_ref.at[batch, :, rows], qm_smem, ready[6])):
        plgpu.copy_gmem_to_smem(src, dst.at[slot], bar.at[slot])

    _stream(table_ref, row, fetch, free, STAGES)


def _barriers(own: int, streamed: int):
  """(per-warpgroup loads, per-slot ready barriers, per-slot free barriers)."""
  return (plgpu.Barrier(num_barriers=2 * own),
          tuple(plgpu.Barrier(num_barriers=STAGES) for _ in range(streamed)),
          plgpu.Barrier(num_arrivals=2, num_barriers=STAGES))


def _launch(body, scratch, barriers, out_shape, grid, grid_names, interpret, args):
  """plgpu.kernel over three warpgroups; scratch entries that are None (buffers only the
  interpreter needs) reach the body as None."""
  given = [x for x in scratch if x is not None]

  def with_none(smem):
    it = iter(smem)
    return [None if x is None else next(it) for x in scratch]

  def entry(*refs):
    pl.run_scoped(lambda smem, bars: body(*refs, (with_none(smem), bars)), given, barriers,
                  collective_axes="wg")

  params = {"interpret": interpret_params()} if interpret else {}
  return plgpu.kernel(entry, out_shape=out_shape, grid=grid, grid_names=grid_names,
                      num_threads=3, thread_name="wg",
                      compiler_params=plgpu.CompilerParams(approx_math=True), **params)(*args)


def mgpu_backward(q, k, v, spec: MaskSpec, q_meta, k_meta, out, lse, d_out, *,
                  interpret=None, register_ds=None):
  """(dq, dk, dv) of mgpu_forward for the cotangent d_out of its output; lse is the
  forward's [b, h, tq_padded] natural-log logsumexp. interpret / register_ds: as
  mgpu_forward's interpret / register_p."""
  interpret, register_ds = settle_mode(spec, q, k, interpret, register_ds)
  b, tq, h, d = q.shape
  tk, kvh = k.shape[1], k.shape[2]
  group, dtype = h // kvh, q.dtype
  cta_q, cta_k = 2 * BLOCK_Q, 2 * BLOCK_K
  nq, nk = -(-tq // cta_q), -(-tk // cta_k)
  tq_p, tk_p = nq * cta_q, nk * cta_k

  d_out = d_out.astype(dtype)
  # Rows past tq only pad the length: lse +inf there makes their p exactly 0.
  lse2 = jnp.pad(lse[:, :, :tq] * LOG2E, ((0, 0), (0, 0), (0, tq_p - tq)),
                 constant_values=jnp.inf)
  delta = jnp.einsum("bqhd,bqhd->bhq", out.astype(jnp.float32), d_out.astype(jnp.float32))
  delta = jnp.pad(delta, ((0, 0), (0, 0), (0, tq_p - tq)))
  qp, dop, kp, vp = (pad_len(x, n) for x, n in ((q, tq_p), (d_out, tq_p), (k, tk_p),
                                                 (v, tk_p)))
  qm = packed_meta(spec, q_meta, tq_p, PAD_Q_SEG)
  km = packed_meta(spec, k_meta, tk_p, PAD_K_SEG)
  common = dict(spec=spec, scale=d ** -0.5, group=group, register_ds=register_ds,
                interpret=interpret)

  def smem(*shape, dt=dtype, tiled=True):
    return plgpu.SMEM(shape, dt, transforms=TILED if tiled else ())

  dq_table = visit_table(tile_classes(spec, q_meta, k_meta, cta_q, BLOCK_K))
  dq_scratch = [smem(2, BLOCK_Q, d), smem(2, BLOCK_Q, d),
                smem(2, BLOCK_Q, dt=jnp.float32, tiled=False),
                smem(2, BLOCK_Q, dt=jnp.float32, tiled=False),
                smem(2, META, BLOCK_Q, dt=jnp.int32, tiled=False),
                smem(STAGES, d, BLOCK_K), smem(STAGES, d, BLOCK_K), smem(STAGES, BLOCK_K, d),
                smem(STAGES, META, BLOCK_K, dt=jnp.int32, tiled=False)]
  dq_scratch.append(None if register_ds else smem(2, BLOCK_Q, BLOCK_K))
  dq = _launch(functools.partial(_dq_kernel, **common), dq_scratch,
               _barriers(5, 4), jax.ShapeDtypeStruct((b, tq_p, h, d), dtype),
               (h, nq, b), ("heads", "q_seq", "batch"), interpret,
               (dq_table, qp, dop, lse2, delta, qm, kp.transpose(0, 2, 3, 1),
                vp.transpose(0, 2, 3, 1), kp, km))

  dkv_table = visit_table(jnp.swapaxes(
      tile_classes(spec, q_meta, k_meta, BLOCK_Q, cta_k), 1, 2))
  dkv_scratch = [smem(2, BLOCK_K, d), smem(2, BLOCK_K, d),
                 smem(2, META, BLOCK_K, dt=jnp.int32, tiled=False),
                 smem(STAGES, BLOCK_Q, d), smem(STAGES, d, BLOCK_Q), smem(STAGES, BLOCK_Q, d),
                 smem(STAGES, d, BLOCK_Q),
                 smem(STAGES, BLOCK_Q, dt=jnp.float32, tiled=False),
                 smem(STAGES, BLOCK_Q, dt=jnp.float32, tiled=False),
                 smem(STAGES, META, BLOCK_Q, dt=jnp.int32, tiled=False)]
  dkv_scratch += [None, None] if register_ds else [smem(2, BLOCK_K, BLOCK_Q)] * 2
  part = jax.ShapeDtypeStruct((b, tk_p, h, d), dtype)
  dk, dv = _launch(functools.partial(_dkv_kernel, **common), dkv_scratch,
                   _barriers(3, 7), [part, part], (h, nk, b), ("heads", "kv_seq", "batch"),
                   interpret,
                   (dkv_table, kp, vp, km, qp, qp.transpose(0, 2, 3, 1), dop,
                    dop.transpose(0, 2, 3, 1), lse2, delta, qm))

  def fold(x):  # each kv head's group of query-head partials, summed in float32
    x = x[:, :tk].astype(jnp.float32).reshape(b, tk, kvh, group, d).sum(axis=3)
    return x.astype(k.dtype)

  return dq[:, :tq], fold(dk), fold(dv)
