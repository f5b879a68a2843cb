"""Block-sparse flash attention for Hopper: a Pallas kernel for the Mosaic GPU lowering.

  mgpu_forward(q, k, v, spec, q_meta, k_meta) -> (out, lse)   the forward of one call
  unsupported_reason(spec, q_len, k_len, head_dim, dtype)     None, or why not and the fix

The design is FlashAttention-3's, as jax's own Hopper kernel lays it out: a CTA holds 128
query rows split between two compute warpgroups (64 rows each) and a third, memory
warpgroup that streams key/value tiles into shared memory with TMA copies, STAGES tiles
ahead, and is told by barriers when a slot is free again. The compute warpgroups take
turns on the tensor cores (a "schedule" barrier), so one's softmax overlaps the other's
matrix products; both products are wgmma instructions with fp32 accumulators.

What cardjax adds is the mask. The visit table of the Triton kernel (device_tiles.py:
tile_classes and visit_table, computed on device from the per-token metadata, at 128
queries x BLOCK_K keys) lists per CTA the key tiles that can hold a visible pair, FULL
ones first. Every warpgroup walks the same list, so EMPTY tiles are never loaded, FULL
tiles pay no mask work, and PARTIAL tiles evaluate MaskSpec's rule per element from the
tile's metadata (position, block id, stream, segment), which the memory warpgroup copies
beside the keys. Packed documents, the MARS dual stream (aligned or compact), BD3LM and
block-causal masks are all the same code. Rows that see no key return 0 with a logsumexp
of +inf, as the Triton kernel's do, so its backward kernels accept this forward's
residuals.

Layouts: the kernel reads K transposed ([b, kv_heads, d, Tk], made by the caller), so the
first product needs no transposed shared-memory view; the probabilities reach the second
product from registers (REGISTER_P, the fast path) or through shared memory (the path
Mosaic GPU's CPU interpreter runs: it takes wgmma operands from shared memory only and has
no transposed views). Everything else is one code path in both modes.

Checked without a GPU (tests/test_pallas_mgpu.py): numerics in Mosaic GPU's interpret
mode against the dense reference for every mask kind, and the kernel lowered and compiled
by XLA:GPU for an H100 (`make install-gpu-plan`). Not checked without a GPU: the PTX
and SASS that Mosaic GPU makes at load time, the register-operand product, and speed.
"""

from __future__ import annotations

import functools
import math
import os
import warnings

import jax
import jax.numpy as jnp
from jax import lax
from jax.experimental import pallas as pl
from jax.experimental.pallas import mosaic_gpu as plgpu

from cardjax.attention.device_tiles import tile_classes, visit_table
from cardjax.attention.masks import MaskSpec

BLOCK_Q = 64  # query rows per compute warpgroup; a CTA holds two
BLOCK_K = 64  # keys per streamed tile: 128 bytes of bf16, one 128-byte swizzle row
STAGES = 2  # key/value tiles in flight per CTA
HEAD_DIMS = (64, 128)
DTYPES = (jnp.bfloat16, jnp.float16)
META = 4  # position, block id, stream, segment
PAD_Q_SEG, PAD_K_SEG = -2, -1  # length padding: never the same segment as anything
LOG2E = math.log2(math.e)
_ROW = plgpu.Layout.WGMMA.reduce(1)  # one value per accumulator row (query)
_COL = plgpu.Layout.WGMMA.reduce(0)  # one value per accumulator column (key)
TILED = (plgpu.TilingTransform((8, 64)), plgpu.SwizzleTransform(128))  # 16-bit tiles in smem


def unsupported_reason(spec: MaskSpec, q_len: int, k_len: int, head_dim: int,
                       dtype) -> str | None:
  """None when the kernel serves this call; else one line saying why not and the fix."""
  del spec, q_len, k_len  # any mask and length: lengths are padded to whole tiles
  if head_dim not in HEAD_DIMS:
    return (f"head_dim {head_dim} is not one of {HEAD_DIMS} (wgmma tiles of 64); use "
            "attention_impl='pallas_gpu' or 'xla'")
  if jnp.dtype(dtype) not in [jnp.dtype(d) for d in DTYPES]:
    return (f"dtype {jnp.dtype(dtype).name} is not bfloat16 or float16 (wgmma's 16-bit "
            "operands); compute in bfloat16 or use attention_impl='pallas_gpu'")
  return None


def settle_mode(spec: MaskSpec, q, k, interpret, from_registers):
  """(interpret, from_registers) of a call, after refusing inputs the kernels do not serve:
  interpret None means the interpreter unless the default backend is a GPU; from_registers
  None means the left operands from registers when compiled (the interpreter cannot)."""
  interpret = jax.default_backend() != "gpu" if interpret is None else interpret
  reason = unsupported_reason(spec, q.shape[1], k.shape[1], q.shape[-1], q.dtype)
  if reason:
    raise ValueError(reason)
  return interpret, not interpret if from_registers is None else from_registers


def layout_cast(interpret: bool):
  """plgpu.layout_cast, or the identity in the interpreter: layouts are hints to the
  lowering, with no meaning to the interpreter (it has no rule for them)."""
  return (lambda x, layout: x) if interpret else plgpu.layout_cast


def interpret_params():
  """The `interpret` argument of plgpu.kernel for Mosaic GPU's CPU interpreter. It runs
  each simulated warpgroup as its own XLA execution, which holds a thread of the CPU
  client's pool while it waits on a barrier; the pool has one thread per core unless
  PJRT_NPROC says otherwise, and with fewer than 4 a kernel of three warpgroups can
  deadlock. Warns then, naming the fix (the variable is read when jax starts)."""
  from jax._src.pallas.mosaic_gpu.interpret.params import InterpretGPUParams

  threads = int(os.environ.get("PJRT_NPROC") or os.cpu_count() or 1)
  if threads < 4:
    warnings.warn(f"Mosaic GPU's interpreter may deadlock with {threads} CPU-client "
                  "threads: set PJRT_NPROC=8 in the environment before jax starts",
                  RuntimeWarning, stacklevel=3)
  return InterpretGPUParams()


def packed_meta(spec: MaskSpec, meta, length: int, pad_segment: int):
  """[b, META, length] int32 of (position, block id, stream, segment), padded past the
  real tokens with a segment no real token has."""
  pos, stream, seg = (x.astype(jnp.int32) for x in meta)
  blk = pos // spec.block_size if spec.block_size > 0 else jnp.zeros_like(pos)
  out = jnp.stack([pos, blk, stream, seg], axis=1)
  pad = length - out.shape[-1]
  fill = jnp.zeros((out.shape[0], META, pad), jnp.int32).at[:, 3].set(pad_segment)
  return jnp.concatenate([out, fill], axis=-1)


def _kernel(table_ref, q_ref, kt_ref, v_ref, qm_ref, km_ref, out_ref, lse_ref, scoped, *,
            spec, scale, group, register_p, interpret):
  (q_smem2, kt_smem, v_smem, qm_smem2, km_smem, p_smem2, lse_smem2), barriers, sched = scoped
  k_ready, v_ready, km_ready, q_ready, k_free, v_free = barriers
  batch, head = lax.axis_index("batch"), lax.axis_index("heads")
  q_tile, wg = lax.axis_index("q_seq"), lax.axis_index("wg")
  n_full = table_ref[batch, q_tile, 0]
  n_visits = n_full + table_ref[batch, q_tile, 1]
  stages, _, block_k = kt_smem.shape
  block_q, head_dim = q_smem2.shape[1:]
  dtype = q_smem2.dtype
  cast = layout_cast(interpret)

  def take_turn():  # the two compute warpgroups alternate on the tensor cores
    plgpu.barrier_arrive(sched)
    plgpu.barrier_wait(sched)

  @pl.when(wg < 2)
  def _compute():
    plgpu.set_max_registers(232, action="increase")
    q_smem, qm_smem, p_smem, lse_smem = (x.at[wg] for x in (q_smem2, qm_smem2, p_smem2,
                                                              lse_smem2))
    base = q_tile * (2 * block_q) + wg * block_q
    plgpu.copy_gmem_to_smem(q_ref.at[batch, pl.ds(base, block_q), head], q_smem,
                            q_ready.at[wg])
    plgpu.copy_gmem_to_smem(qm_ref.at[batch, :, pl.ds(base, block_q)], qm_smem,
                            q_ready.at[2 + wg])
    plgpu.barrier_wait(q_ready.at[wg])
    plgpu.barrier_wait(q_ready.at[2 + wg])
    # A layout_cast right after a load is the load's layout (Mosaic GPU reads it ahead).
    q_meta = [cast(qm_smem[i], _ROW) for i in range(META)]
    shape = (block_q, block_k)
    rows = [lax.broadcast_in_dim(x, shape, [0]) for x in q_meta]

    @pl.when(n_visits > 0)
    def _():
      plgpu.barrier_wait(k_ready.at[0])

    pl.when(wg == 1)(take_turn)

    def visit(step, carry, masked: bool):
      acc, m, l = carry
      slot = lax.rem(step, jnp.asarray(stages, step.dtype))
      plgpu.barrier_wait(km_ready.at[slot])  # every visit, so the barrier's phase keeps step
      if masked:  # read before k_free lets the memory warpgroup overwrite the slot
        cols = [lax.broadcast_in_dim(cast(km_smem[slot, i], _COL), shape, [1])
                for i in range(META)]

      def scores(acc_ref):
        plgpu.wgmma(acc_ref, q_smem, kt_smem.at[slot])
        take_turn()
        return acc_ref[...]

      s = pl.run_scoped(scores, plgpu.ACC(shape, jnp.float32))
      plgpu.barrier_arrive(k_free.at[slot])
      s = s * (scale * LOG2E)  # base-2 exponentials from here on
      if masked:
        # The mask's own rule, with the block ids given (no integer floor division on
        # fragments; positions are >= 0, so packed_meta's pos // block_size is the same).
        (qp, qb, qs, qg), (kp, kb, ks, kg) = rows, cols
        s = jnp.where(spec.allowed_in_blocks(qp, kp, qb, kb, qs, ks, qg, kg), s, -jnp.inf)
      m_new = jnp.maximum(m, s.max(axis=1))
      # A row that has seen no visible key keeps max -inf: subtract 0 instead, so
      # exp2(-inf - 0) = 0 rather than exp2(-inf + inf) = NaN.
      m_safe = jnp.where(m_new == -jnp.inf, 0.0, m_new)
      p = jnp.exp2(s - lax.broadcast_in_dim(m_safe, shape, [0]))
      alpha = jnp.exp2(m - m_safe)
      l = l * alpha + p.sum(axis=1)
      p16 = p.astype(dtype)
      plgpu.barrier_arrive(sched)  # softmax done
      plgpu.barrier_wait(v_ready.at[slot])
      plgpu.barrier_wait(sched)  # the tensor cores are ours
      if not register_p:
        p_smem[...] = p16
        plgpu.commit_smem()

      def values(acc_ref):
        plgpu.wgmma(acc_ref, p16 if register_p else p_smem, v_smem.at[slot])
        nxt = step + 1

        @pl.when(nxt < n_visits)
        def _():
          plgpu.barrier_wait(k_ready.at[lax.rem(nxt, jnp.asarray(stages, nxt.dtype))])
        return acc_ref[...]

      # A fresh accumulator, added after: the interpreter has no run_state, and the add is
      # 64 x d registers against the product's 64 x 64 x d multiply-adds.
      pv = pl.run_scoped(values, plgpu.ACC((block_q, head_dim), jnp.float32))
      plgpu.barrier_arrive(v_free.at[slot])
      return acc * lax.broadcast_in_dim(alpha, acc.shape, [0]) + pv, m_new, l

    carry = (cast(jnp.zeros((block_q, head_dim), jnp.float32), plgpu.Layout.WGMMA),
             cast(jnp.full((block_q,), -jnp.inf, jnp.float32), _ROW),
             cast(jnp.zeros((block_q,), jnp.float32), _ROW))
    carry = lax.fori_loop(0, n_full, functools.partial(visit, masked=False), carry)
    acc, m, l = lax.fori_loop(n_full, n_visits, functools.partial(visit, masked=True), carry)
    pl.when(wg == 0)(take_turn)
    empty = l == 0.0
    l_safe = jnp.where(empty, 1.0, l)
    q_smem[...] = (acc / lax.broadcast_in_dim(l_safe, acc.shape, [0])).astype(dtype)
    # Natural-log logsumexp of the scaled scores, +inf where the row saw nothing.
    lse_smem[...] = jnp.where(empty, jnp.inf, (m + jnp.log2(l_safe)) / LOG2E)
    plgpu.commit_smem()
    plgpu.copy_smem_to_gmem(q_smem, out_ref.at[batch, pl.ds(base, block_q), head])
    plgpu.copy_smem_to_gmem(lse_smem, lse_ref.at[batch, head, pl.ds(base, block_q)])
    plgpu.wait_smem_to_gmem(0)

  @pl.when(wg == 2)
  def _memory():
    plgpu.set_max_registers(40, action="decrease")
    kv_head = lax.div(head, jnp.asarray(group, head.dtype))

    def fetch_k(step, slot):
      keys = pl.ds(table_ref[batch, q_tile, 2 + step] * block_k, block_k)
      plgpu.copy_gmem_to_smem(kt_ref.at[batch, kv_head, :, keys], kt_smem.at[slot],
                              k_ready.at[slot])
      plgpu.copy_gmem_to_smem(km_ref.at[batch, :, keys], km_smem.at[slot], km_ready.at[slot])

    def fetch_v(step, slot):
      keys = pl.ds(table_ref[batch, q_tile, 2 + step] * block_k, block_k)
      plgpu.copy_gmem_to_smem(v_ref.at[batch, keys, kv_head], v_smem.at[slot],
                              v_ready.at[slot])

    for i in range(stages):
      @pl.when(i < n_visits)
      def _():
        fetch_k(jnp.int32(i), i)
        fetch_v(jnp.int32(i), i)

    @pl.loop(0, jnp.maximum(n_visits - stages, 0))
    def _(done):
      slot = lax.rem(done, jnp.asarray(stages, done.dtype))
      plgpu.barrier_wait(k_free.at[slot])
      fetch_k(done + stages, slot)
      plgpu.barrier_wait(v_free.at[slot])
      fetch_v(done + stages, slot)

    # Wait out the last tiles' releases too, so every barrier phase is observed (the
    # interpreter checks it; on the GPU this warpgroup has nothing else to do).
    @pl.loop(jnp.maximum(n_visits - stages, 0), n_visits)
    def _(done):
      slot = lax.rem(done, jnp.asarray(stages, done.dtype))
      plgpu.barrier_wait(k_free.at[slot])
      plgpu.barrier_wait(v_free.at[slot])


def mgpu_forward(q, k, v, spec: MaskSpec, q_meta, k_meta, *, interpret=None,
                 register_p=None):
  """(out [b, tq, h, d] in q's dtype, lse [b, h, tq_padded] float32): the forward of
  block-sparse attention with the contract of reference_attention. interpret: run Mosaic
  GPU's CPU interpreter (None: unless the default backend is a GPU), which takes the
  probabilities through shared memory (register_p None: from registers when compiled)."""
  interpret, register_p = settle_mode(spec, q, k, interpret, register_p)
  b, tq, h, d = q.shape
  tk, kvh = k.shape[1], k.shape[2]
  cta_q = 2 * BLOCK_Q
  nq, nk = -(-tq // cta_q), -(-tk // BLOCK_K)
  tq_p, tk_p = nq * cta_q, nk * BLOCK_K
  table = visit_table(tile_classes(spec, q_meta, k_meta, cta_q, BLOCK_K))
  qp = jnp.pad(q, ((0, 0), (0, tq_p - tq), (0, 0), (0, 0)))
  kt = jnp.pad(k, ((0, 0), (0, tk_p - tk), (0, 0), (0, 0))).transpose(0, 2, 3, 1)
  vp = jnp.pad(v, ((0, 0), (0, tk_p - tk), (0, 0), (0, 0)))
  qm = packed_meta(spec, q_meta, tq_p, PAD_Q_SEG)
  km = packed_meta(spec, k_meta, tk_p, PAD_K_SEG)
  scratch = [
      plgpu.SMEM((2, BLOCK_Q, d), q.dtype, transforms=TILED),  # q, then the output
      plgpu.SMEM((STAGES, d, BLOCK_K), q.dtype, transforms=TILED),
      plgpu.SMEM((STAGES, BLOCK_K, d), q.dtype, transforms=TILED),
      plgpu.SMEM((2, META, BLOCK_Q), jnp.int32),
      plgpu.SMEM((STAGES, META, BLOCK_K), jnp.int32),
      plgpu.SMEM((2, BLOCK_Q, BLOCK_K), q.dtype, transforms=TILED),
      plgpu.SMEM((2, BLOCK_Q), jnp.float32),
  ]
  barriers = (plgpu.Barrier(num_barriers=STAGES), plgpu.Barrier(num_barriers=STAGES),
              plgpu.Barrier(num_barriers=STAGES), plgpu.Barrier(num_barriers=4),
              plgpu.Barrier(num_arrivals=2, num_barriers=STAGES),
              plgpu.Barrier(num_arrivals=2, num_barriers=STAGES))
  body = functools.partial(_kernel, spec=spec, scale=d ** -0.5, group=h // kvh,
                           register_p=register_p, interpret=interpret)

  def entry(*refs):
    pl.run_scoped(lambda smem, bars, sched: body(*refs, (smem, bars, sched)), scratch,
                  barriers, plgpu.Barrier(num_arrivals=2), collective_axes="wg")

  params = {"interpret": interpret_params()} if interpret else {}
  out, lse = plgpu.kernel(
      entry,
      out_shape=[jax.ShapeDtypeStruct((b, tq_p, h, d), q.dtype),
                 jax.ShapeDtypeStruct((b, h, tq_p), jnp.float32)],
      grid=(h, nq, b), grid_names=("heads", "q_seq", "batch"),
      num_threads=3, thread_name="wg",
      compiler_params=plgpu.CompilerParams(approx_math=True),
      **params,
  )(table, qp, kt, vp, qm, km)
  return out[:, :tq], lse
