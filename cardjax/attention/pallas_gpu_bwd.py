"""The backward of cardjax.attention.pallas_gpu: a dq kernel and a dk/dv kernel.

Both recompute the probabilities of a visited tile from the forward's logsumexp,
p = exp(q k^T * scale - lse), instead of storing them, and walk visit tables built like the
forward's (pallas_gpu.visit_table) on the backward's own tiles:

  dq kernel     grid (query tiles, batch, heads); walks, per query tile, the key tiles
                that tile sees: dq = sum_k ds k * scale, ds = p * (do v^T - delta);
  dk/dv kernel  grid (key tiles, batch, heads); walks the TRANSPOSED classes, per key tile
                the query tiles that see it: dv = sum p^T do, dk = sum ds^T q * scale.

delta = rowsum(o * do) is a cheap jnp pre-pass. FULL tiles skip the mask, PARTIAL tiles
zero the masked probabilities per element, EMPTY tiles are never loaded. A query row that
saw no key carries lse = +inf, so its p is exactly 0: zero gradient everywhere.

GQA: the dk/dv kernel runs per QUERY head (kv block h // group) and writes float32
[b, tk, heads, d] partials that one jnp sum folds into the kv heads.
"""

from __future__ import annotations

import functools

import jax
import jax.numpy as jnp
from jax.experimental import pallas as pl

from cardjax.attention.pallas_common import compiler_params, dot, pad_len, visible, walk


def _dq_kernel(table_ref, q_ref, do_ref, lse_ref, delta_ref, k_ref, v_ref, qp_ref, qs_ref, qg_ref,
               kp_ref, ks_ref, kg_ref, dq_ref, *, spec, scale, block_k, k_len):
  q, do = q_ref[...], do_ref[...]
  lse, delta = lse_ref[...], delta_ref[...]
  q_meta = (qp_ref[...], qs_ref[...], qg_ref[...])

  def body(tile, dq, masked):
    start = pl.multiple_of(tile * block_k, block_k)
    keys = pl.ds(start, block_k)
    k, v = k_ref[keys, :], v_ref[keys, :]
    p = jnp.exp(dot(q, k, trans_b=True) * scale - lse[:, None])
    if masked:
      k_meta = (kp_ref[keys], ks_ref[keys], kg_ref[keys])
      p = jnp.where(visible(spec, q_meta, k_meta, start, k_len), p, 0.0)
    ds = p * (dot(do, v, trans_b=True) - delta[:, None])
    return dq + dot(ds.astype(k.dtype), k)

  dq = walk(table_ref, body, jnp.zeros(q.shape, jnp.float32))
  dq_ref[...] = (dq * scale).astype(dq_ref.dtype)


def _dkv_kernel(table_ref, k_ref, v_ref, q_ref, do_ref, lse_ref, delta_ref, kp_ref, ks_ref,
                kg_ref, qp_ref, qs_ref, qg_ref, dk_ref, dv_ref, *, spec, scale, block_q, k_len):
  k, v = k_ref[...], v_ref[...]
  k_meta = (kp_ref[...], ks_ref[...], kg_ref[...])
  k_start = pl.program_id(0) * k.shape[0]

  def body(tile, carry, masked):
    dk, dv = carry
    start = pl.multiple_of(tile * block_q, block_q)
    rows = pl.ds(start, block_q)
    q, do = q_ref[rows, :], do_ref[rows, :]
    lse, delta = lse_ref[rows], delta_ref[rows]
    p = jnp.exp(dot(q, k, trans_b=True) * scale - lse[:, None])  # [block_q, block_k]
    if masked:
      q_meta = (qp_ref[rows], qs_ref[rows], qg_ref[rows])
      p = jnp.where(visible(spec, q_meta, k_meta, k_start, k_len), p, 0.0)
    dv = dv + dot(p.astype(do.dtype), do, trans_a=True)
    ds = p * (dot(do, v, trans_b=True) - delta[:, None])
    return dk + dot(ds.astype(q.dtype), q, trans_a=True), dv

  zeros = jnp.zeros(k.shape, jnp.float32)
  dk, dv = walk(table_ref, body, (zeros, zeros))
  dk_ref[...] = dk * scale
  dv_ref[...] = dv


def backward(cfg, q, k, v, q_meta, k_meta, tables, out, lse, d_out):
  """(dq, dk, dv) of pallas_gpu_attention for the cotangent d_out of its output."""
  _, dq_table, dkv_table = tables
  b, tq, h, d = q.shape
  tk, kvh = k.shape[1], k.shape[2]
  group, scale = h // kvh, d ** -0.5
  bq, bk = cfg.bwd_block_q, cfg.bwd_block_k
  nq, nk = -(-tq // bq), -(-tk // bk)
  tq_p, tk_p = nq * bq, nk * bk
  d_out = d_out.astype(q.dtype)
  delta = jnp.einsum("bqhd,bqhd->bhq", out.astype(jnp.float32), d_out.astype(jnp.float32))
  # Padded query rows get lse = +inf (p = 0) and delta = 0: they contribute nothing.
  lse = jnp.pad(lse[:, :, :tq], ((0, 0), (0, 0), (0, tq_p - tq)), constant_values=jnp.inf)
  delta = jnp.pad(delta, ((0, 0), (0, 0), (0, tq_p - tq)))
  qp, dop = pad_len(q, tq_p), pad_len(d_out, tq_p)
  kp, vp = pad_len(k, tk_p), pad_len(v, tk_p)
  qm = [pad_len(x, tq_p) for x in q_meta]
  km = [pad_len(x, tk_p) for x in k_meta]
  params = compiler_params(d)

  # dq: per query tile, like the forward.
  row = pl.BlockSpec((None, bq, None, d), lambda i, j, n: (j, i, n, 0))
  row_stat = pl.BlockSpec((None, None, bq), lambda i, j, n: (j, n, i))
  all_kv = pl.BlockSpec((None, tk_p, None, d), lambda i, j, n: (j, 0, n // group, 0))
  dq = pl.pallas_call(
      functools.partial(_dq_kernel, spec=cfg.spec, scale=scale, block_k=bk, k_len=tk),
      grid=(nq, b, h),
      in_specs=[pl.BlockSpec((None, None, dq_table.shape[-1]), lambda i, j, n: (j, i, 0)),
                row, row, row_stat, row_stat, all_kv, all_kv]
               + [pl.BlockSpec((None, bq), lambda i, j, n: (j, i))] * 3
               + [pl.BlockSpec((None, tk_p), lambda i, j, n: (j, 0))] * 3,
      out_specs=row,
      out_shape=jax.ShapeDtypeStruct((b, tq_p, h, d), q.dtype),
      compiler_params=params,
      interpret=cfg.interpret,
      name="cardjax_block_sparse_attention_dq",
  )(dq_table, qp, dop, lse, delta, kp, vp, *qm, *km)[:, :tq]

  # dk / dv: per key tile and QUERY head, over the query tiles that see the key tile.
  col = pl.BlockSpec((None, bk, None, d), lambda i, j, n: (j, i, n // group, 0))
  col_out = pl.BlockSpec((None, bk, None, d), lambda i, j, n: (j, i, n, 0))
  all_q = pl.BlockSpec((None, tq_p, None, d), lambda i, j, n: (j, 0, n, 0))
  all_stat = pl.BlockSpec((None, None, tq_p), lambda i, j, n: (j, n, 0))
  part = jax.ShapeDtypeStruct((b, tk_p, h, d), jnp.float32)
  dk, dv = pl.pallas_call(
      functools.partial(_dkv_kernel, spec=cfg.spec, scale=scale, block_q=bq, k_len=tk),
      grid=(nk, b, h),
      in_specs=[pl.BlockSpec((None, None, dkv_table.shape[-1]), lambda i, j, n: (j, i, 0)),
                col, col, all_q, all_q, all_stat, all_stat]
               + [pl.BlockSpec((None, bk), lambda i, j, n: (j, i))] * 3
               + [pl.BlockSpec((None, tq_p), lambda i, j, n: (j, 0))] * 3,
      out_specs=[col_out, col_out],
      out_shape=[part, part],
      compiler_params=params,
      interpret=cfg.interpret,
      name="cardjax_block_sparse_attention_dkv",
  )(dkv_table, kp, vp, qp, dop, lse, delta, *km, *qm)

  def fold(x):  # sum each kv head's group of query-head partials
    return x[:, :tk].reshape(b, tk, kvh, group, d).sum(axis=3).astype(k.dtype)

  return dq, fold(dk), fold(dv)
