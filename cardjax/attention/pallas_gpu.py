"""Block-sparse flash attention for GPUs: a Pallas kernel for the Triton lowering.

  pallas_gpu_attention(q, k, v, spec, q_meta, k_meta)   same contract as reference_attention
  unsupported_reason(spec, q_len, k_len, head_dim)      None, or why not and what to do

The [queries x keys] score matrix is cut into block_q x block_k tiles. Per batch row a small
jnp pre-pass (`tile_classes`) classifies every (query tile, key tile) pair as EMPTY, PARTIAL
or FULL from per-tile SUMMARIES of the real metadata (min / max of position, block, stream
and segment id over the tile's real slots), conservatively:

  EMPTY    no (query, key) pair of the two boxes of summaries can satisfy the mask rule:
           provably nothing visible, the kernels never load the tile;
  FULL     every pair of the boxes satisfies it (one segment, rule certain) and the key tile
           holds no length padding: the kernels skip all mask work;
  PARTIAL  anything else: the kernels evaluate MaskSpec.allowed per element on the real
           metadata (so packed documents are exact) and mask padded key slots by index.

Because EMPTY and FULL are only claimed when provable, the result is exact for every
metadata the reference accepts; a tile the summaries cannot decide costs mask work, never
correctness. The metadata is traced data in training (packed rows), which is why the table
is built on device, O(batch x tiles) work, instead of on the host. For the layouts the
objectives produce it is as tight as the host tile table (cardjax/attention/tiles.py)
except at document boundaries inside a tile: the causal upper triangle, the MARS
clean->noisy quarter and the noisy->noisy tiles outside the block band are all EMPTY.

Nothing here reads an index as a position or assumes two equal halves, so the compact
MARS row (MaskSpec.noisy_len = N: [clean (L) | the N-token stream of the blocks that carry
loss], any total length) is served as it is: its clean->noisy tiles are EMPTY too, and a
compact tile that mixes documents or filler only turns PARTIAL
(tests/test_pallas_gpu_compact.py).

`visit_table` turns the classes into one int32 row per query tile:
[n_full, n_partial, key tiles that are FULL..., key tiles that are PARTIAL..., padding];
the forward and dq kernels walk it, the dk/dv kernel walks the same construction over the
transposed classes (per key tile, the query tiles that see it). Each kernel runs two loops,
the FULL tiles without a mask, then the PARTIAL tiles with one.

Row guards: masked scores are -inf and the running max is replaced by 0 while it is still
-inf, so a row with no visible key accumulates nothing; its output is 0 and its saved
logsumexp is +inf, which makes every recomputed probability exp(s - lse) exactly 0 in the
backward: zero gradient, no NaN. (The dense reference gives such a row the mean of v
instead; the two agree on every row that sees at least one key.)

GQA: the grid runs over query heads; the key/value block of query head h is kv head
h // (heads // kv_heads). dk / dv are produced per query head in float32 and summed over
each group outside the kernel.

Versions: written against `jax.experimental.pallas.triton` (plgpu.CompilerParams), which
jax 0.10 and 0.11 ship (deprecated upstream in favour of Mosaic GPU, still present through
0.12). On CPU it runs with interpret=True (the default off GPU); the Triton lowering itself
can be checked without a GPU with `lower_for_gpu` (tests/test_pallas_gpu.py does).
"""

from __future__ import annotations

import dataclasses
import functools

import jax
import jax.numpy as jnp
import numpy as np
from jax.experimental import pallas as pl

from cardjax.attention.kernel_checks import call_reason, check_inputs
from cardjax.attention.device_tiles import (EMPTY, FULL, PARTIAL, tile_classes,  # noqa: F401
                                            visit_fractions, visit_table)
from cardjax.attention.masks import MaskSpec
from cardjax.attention.pallas_common import (HEAD_DIMS, NUM_STAGES, compiler_params, dot,
                                             num_warps, pad_len, pow2_block, visible, walk)
from cardjax.attention.pallas_gpu_fit import settle_tiles, target_gpu
from cardjax.attention.pallas_gpu_bwd import backward
from cardjax.errors import CardjaxError

# Forward tiles: 128 queries x 64 keys keeps q, the f32 accumulator and one k/v tile in
# registers for head dims up to 128 on sm80+. Backward tiles are smaller because the dq
# and dk/dv kernels hold two accumulators' worth of operands. Both fit the shared memory
# of an A100 and an H100 for every dtype and head dim (pallas_gpu_fit; docs/pallas_gpu.md);
# on a GPU with less they are halved until they fit.
BLOCK_Q, BLOCK_K = 128, 64
BWD_BLOCK_Q, BWD_BLOCK_K = 64, 64


def unsupported_reason(spec, q_len: int, k_len: int, head_dim: int) -> str | None:
  """None when the kernel serves this call; else one line saying why not and the fix."""
  reason = call_reason(spec, q_len, k_len, cache_layout=False)
  if reason:
    return reason
  if head_dim not in HEAD_DIMS:
    return (f"head_dim {head_dim} is not one of {HEAD_DIMS} (Triton tiles need a power of "
            f"two >= 16; larger dims overflow registers); use attention_impl='xla'")
  return None


# --------------------------------------------------------------------------- tile tables


def _at_most(requested: int | None, limit: int) -> int | None:
  return None if requested is None else min(requested, limit)


# --------------------------------------------------------------------------- kernels


def _fwd_kernel(table_ref, q_ref, k_ref, v_ref, qp_ref, qs_ref, qg_ref, kp_ref, ks_ref, kg_ref,
                o_ref, lse_ref, *, spec, scale, block_k, k_len):
  q = q_ref[...]
  q_meta = (qp_ref[...], qs_ref[...], qg_ref[...])
  block_q, d = q.shape

  def body(tile, carry, masked):
    acc, m, l = carry
    start = pl.multiple_of(tile * block_k, block_k)
    keys = pl.ds(start, block_k)
    k, v = k_ref[keys, :], v_ref[keys, :]
    s = dot(q, k, trans_b=True) * scale
    if masked:  # only PARTIAL tiles pay for the mask
      k_meta = (kp_ref[keys], ks_ref[keys], kg_ref[keys])
      s = jnp.where(visible(spec, q_meta, k_meta, start, k_len), s, -jnp.inf)
    m_new = jnp.maximum(m, jnp.max(s, axis=1))
    # While a row has seen no visible key its max is -inf; subtracting 0 instead keeps
    # exp(-inf - 0) = 0 rather than exp(-inf + inf) = NaN.
    m_safe = jnp.where(m_new == -jnp.inf, 0.0, m_new)
    p = jnp.exp(s - m_safe[:, None])
    alpha = jnp.exp(m - m_safe)
    acc = acc * alpha[:, None] + dot(p.astype(v.dtype), v)
    return acc, m_new, l * alpha + jnp.sum(p, axis=1)

  init = (jnp.zeros((block_q, d), jnp.float32), jnp.full((block_q,), -jnp.inf, jnp.float32),
          jnp.zeros((block_q,), jnp.float32))
  acc, m, l = walk(table_ref, body, init)
  empty = l == 0.0
  o_ref[...] = (acc / jnp.where(empty, 1.0, l)[:, None]).astype(o_ref.dtype)
  # +inf for rows that saw nothing: the backward's exp(s - lse) is then exactly 0.
  lse_ref[...] = jnp.where(empty, jnp.inf, m + jnp.log(jnp.where(empty, 1.0, l)))


def _forward(q, k, v, q_meta, k_meta, table, *, spec, block_q, block_k, interpret):
  """(out [b, tq, h, d], lse [b, h, tq_padded] float32) of the forward kernel."""
  b, tq, h, d = q.shape
  tk, kvh = k.shape[1], k.shape[2]
  group = h // kvh
  nq, nk = -(-tq // block_q), -(-tk // block_k)
  tq_p, tk_p = nq * block_q, nk * block_k
  qp = pad_len(q, tq_p)
  kp, vp = pad_len(k, tk_p), pad_len(v, tk_p)
  qm = [pad_len(x.astype(jnp.int32), tq_p) for x in q_meta]
  km = [pad_len(x.astype(jnp.int32), tk_p) for x in k_meta]
  width = table.shape[-1]
  kernel = functools.partial(_fwd_kernel, spec=spec, scale=d ** -0.5, block_k=block_k,
                             k_len=tk)
  q_spec = pl.BlockSpec((None, block_q, None, d), lambda i, j, n: (j, i, n, 0))
  kv_spec = pl.BlockSpec((None, tk_p, None, d), lambda i, j, n: (j, 0, n // group, 0))
  qm_spec = pl.BlockSpec((None, block_q), lambda i, j, n: (j, i))
  km_spec = pl.BlockSpec((None, tk_p), lambda i, j, n: (j, 0))
  out, lse = pl.pallas_call(
      kernel,
      grid=(nq, b, h),
      in_specs=[pl.BlockSpec((None, None, width), lambda i, j, n: (j, i, 0)),
                q_spec, kv_spec, kv_spec] + [qm_spec] * 3 + [km_spec] * 3,
      out_specs=[q_spec, pl.BlockSpec((None, None, block_q), lambda i, j, n: (j, n, i))],
      out_shape=[jax.ShapeDtypeStruct((b, tq_p, h, d), q.dtype),
                 jax.ShapeDtypeStruct((b, h, tq_p), jnp.float32)],
      compiler_params=compiler_params(d),
      interpret=interpret,
      name="cardjax_block_sparse_attention_fwd",
  )(table, qp, kp, vp, *qm, *km)
  return out[:, :tq], lse


# --------------------------------------------------------------------------- public entry


@dataclasses.dataclass(frozen=True)
class Config:
  """The static (hashable) settings of one call: mask, tiles of each pass, interpreter,
  and which kernels run each pass ("triton", or "mosaic": the Hopper kernels of
  pallas_mgpu.py and pallas_mgpu_bwd.py; either backward takes either forward's
  residuals)."""
  spec: MaskSpec
  interpret: bool
  block_q: int
  block_k: int
  bwd_block_q: int
  bwd_block_k: int
  forward: str = "triton"
  backward: str = "triton"


def pallas_gpu_attention(q, k, v, spec: MaskSpec, q_meta, k_meta, *, interpret=None,
                         block_q=None, block_k=None, bwd_block_q=None, bwd_block_k=None,
                         forward: str = "triton", backward: str | None = None):
  """Block-sparse flash attention; the contract of reference_attention.

  q [b, tq, h, d]; k, v [b, tk, kv_heads, d]; q_meta / k_meta (positions, streams,
  segment_ids), each [b, len] integer. Returns [b, tq, h, d] in q's dtype; float32 scores,
  softmax and accumulation. Rows with no visible key return 0 (and get zero gradient).
  interpret: run the Pallas interpreter (None: True unless the default backend is a GPU).
  block_q / block_k: forward tile sizes (powers of two >= 16; None: 128 x 64, shrunk for
  short inputs); bwd_block_q / bwd_block_k: the dq and dk/dv kernels' tiles (None:
  min(block_q, 64) x min(block_k, 64), likewise shrunk).
  Compiled for a GPU (not interpret mode) whose shared memory pallas_gpu_fit knows (the
  device kind of q's sharding, of the abstract mesh, or of the default GPU): default tiles
  are halved until they fit it, and tiles passed explicitly that cannot fit raise
  CardjaxError naming the kernel, the tiles, the bytes needed and the limit.
  Differentiable: jax.custom_vjp with Pallas dq and dk/dv kernels.
  forward="mosaic": the forward runs the Hopper kernel (pallas_mgpu.py: bf16 / fp16, head
  dims 64 and 128, its own 128 x 64 tiles); backward: the gradient kernels, "triton" or
  "mosaic" (pallas_mgpu_bwd.py, same limits), None: the forward's choice.
  """
  backward = forward if backward is None else backward
  for name, value in (("forward", forward), ("backward", backward)):
    if value not in ("triton", "mosaic"):
      raise ValueError(f"{name}={value!r}: use 'triton' or 'mosaic'")
  if "mosaic" in (forward, backward):
    from cardjax.attention import pallas_mgpu

    reason = pallas_mgpu.unsupported_reason(spec, q.shape[1], k.shape[1], q.shape[-1],
                                            q.dtype)
    if reason:
      raise CardjaxError(f"the Hopper attention kernels cannot serve this call: {reason}")
  q_meta, k_meta = (tuple(jnp.asarray(x) for x in m) for m in (q_meta, k_meta))
  check_inputs(q, k, v, spec, q_meta, k_meta, kernel="pallas_gpu_attention", cache_layout=False,
               unsupported=unsupported_reason)
  if interpret is None:
    interpret = jax.default_backend() != "gpu"
  tq, tk = q.shape[1], k.shape[1]
  # The shared-memory limits bind only where Triton compiles the kernels.
  settle = functools.partial(settle_tiles, gpu=None if interpret else target_gpu(q),
                             kind=spec.kind, head_dim=q.shape[-1],
                             dtype=q.dtype,
                             num_warps=num_warps(q.shape[-1]), num_stages=NUM_STAGES)
  fwd = settle(("fwd",), pow2_block(block_q, BLOCK_Q, tq), pow2_block(block_k, BLOCK_K, tk),
               explicit=block_q is not None or block_k is not None,
               names=("block_q", "block_k"))
  bwd_q = bwd_block_q if bwd_block_q is not None else _at_most(block_q, BWD_BLOCK_Q)
  bwd_k = bwd_block_k if bwd_block_k is not None else _at_most(block_k, BWD_BLOCK_K)
  # Backward tiles derived from the forward's are defaults: halved, never refused.
  bwd = settle(("dq", "dkv"), pow2_block(bwd_q, BWD_BLOCK_Q, tq),
               pow2_block(bwd_k, BWD_BLOCK_K, tk),
               explicit=bwd_block_q is not None or bwd_block_k is not None,
               names=("bwd_block_q", "bwd_block_k"))
  cfg = Config(spec=spec, interpret=bool(interpret), block_q=fwd[0], block_k=fwd[1],
               bwd_block_q=bwd[0], bwd_block_k=bwd[1], forward=forward, backward=backward)
  q_meta, k_meta = (tuple(x.astype(jnp.int32) for x in m) for m in (q_meta, k_meta))
  # The tables depend on the metadata only: built once here, outside the differentiated
  # function, and dead code under jit when no gradient is taken.
  # (The Hopper kernels build their own, at their 128 x 64 and 64 x 128 tiles.)
  none = jnp.zeros((0,), jnp.int32)
  fwd_table = (visit_table(tile_classes(spec, q_meta, k_meta, cfg.block_q, cfg.block_k))
               if forward == "triton" else none)
  tables = (fwd_table, none, none)
  if backward == "triton":
    bwd_classes = tile_classes(spec, q_meta, k_meta, cfg.bwd_block_q, cfg.bwd_block_k)
    tables = (fwd_table, visit_table(bwd_classes),
              visit_table(jnp.swapaxes(bwd_classes, 1, 2)))
  return _attention(q, k, v, q_meta, k_meta, tables, cfg)


def _run_forward(q, k, v, q_meta, k_meta, tables, cfg):
  """(out, lse) of the configured forward kernel; both give the natural-log logsumexp of
  the scaled scores (+inf on rows that see nothing) that the backward reads."""
  if cfg.forward == "mosaic":
    from cardjax.attention.pallas_mgpu import mgpu_forward

    return mgpu_forward(q, k, v, cfg.spec, q_meta, k_meta, interpret=cfg.interpret)
  return _forward(q, k, v, q_meta, k_meta, tables[0], spec=cfg.spec, block_q=cfg.block_q,
                  block_k=cfg.block_k, interpret=cfg.interpret)


@functools.partial(jax.custom_vjp, nondiff_argnums=(6,))
def _attention(q, k, v, q_meta, k_meta, tables, cfg):
  return _run_forward(q, k, v, q_meta, k_meta, tables, cfg)[0]


def _attention_fwd(q, k, v, q_meta, k_meta, tables, cfg):
  out, lse = _run_forward(q, k, v, q_meta, k_meta, tables, cfg)
  return out, (q, k, v, q_meta, k_meta, tables, out, lse)


def _attention_bwd(cfg, res, d_out):
  q, k, v, q_meta, k_meta, tables, out, lse = res
  if cfg.backward == "mosaic":
    from cardjax.attention.pallas_mgpu_bwd import mgpu_backward

    dq, dk, dv = mgpu_backward(q, k, v, cfg.spec, q_meta, k_meta, out, lse, d_out,
                               interpret=cfg.interpret)
  else:
    dq, dk, dv = backward(cfg, q, k, v, q_meta, k_meta, tables, out, lse, d_out)
  zeros = lambda tree: jax.tree.map(  # noqa: E731  integer inputs take float0 cotangents
      lambda x: np.zeros(x.shape, jax.dtypes.float0), tree)
  return dq, dk, dv, zeros(q_meta), zeros(k_meta), zeros(tables)


_attention.defvjp(_attention_fwd, _attention_bwd)


def lower_for_gpu(fn, *args, device_kind: str = "NVIDIA H100"):
  """Lower `fn(*args)` for CUDA on any machine: the Pallas calls inside go through the
  Triton lowering (every primitive needs a Triton rule, every tile shape must be legal),
  without compiling or running. Returns the lowered StableHLO text.

  The lowering runs under an abstract mesh whose device is a GPU of `device_kind`: from
  jax 0.11 the Triton rule reads the target's compute capability from the device and stops
  on a machine without a GPU unless one is named this way (jax 0.10 does not ask)."""
  device = jax.sharding.AbstractDevice(device_kind=device_kind, num_cores=None, platform="gpu")
  mesh = jax.sharding.AbstractMesh((1,), ("gpu",), abstract_device=device)
  with jax.sharding.use_abstract_mesh(mesh):
    return jax.jit(fn).trace(*args).lower(lowering_platforms=("cuda",)).as_text()
