"""What the Triton (Pallas GPU) attention kernels share: tile sizes, the f32-accumulating
dot, the per-element mask of a PARTIAL tile, the walk over a visit-table row, compiler
parameters and length padding.

pallas_gpu.py (the training forward and its entry point), pallas_gpu_bwd.py (its dq and
dk/dv kernels) and pallas_decode.py (the flash-decoding kernel over the KV cache) import
these from here, so the dependencies run one way: pallas_gpu -> pallas_gpu_bwd -> this
module, and neither kernel module needs the other's private names.
"""

from __future__ import annotations

import jax.numpy as jnp
from jax import lax
from jax.experimental import pallas as pl
from jax.experimental.pallas import triton as plgpu

from cardjax.attention.masks import MaskSpec

MIN_BLOCK = 16  # Triton's dot needs every operand dimension >= 16
HEAD_DIMS = (16, 32, 64, 128)
# Software-pipelining depth of every kernel's loop: two buffers of each streamed tile, so
# one loads while the other feeds the dots (pallas_gpu_fit's shared-memory formula uses it).
NUM_STAGES = 2


def pow2_block(requested: int | None, default: int, length: int) -> int:
  """The tile size along one axis: the request, or the default shrunk for short inputs."""
  if requested is None:
    return max(MIN_BLOCK, min(default, pl.next_power_of_2(length)))
  if requested < MIN_BLOCK or requested & (requested - 1):
    raise ValueError(f"tile size {requested} must be a power of two >= {MIN_BLOCK}; "
                     f"pass block_q / block_k such as 64 or 128, or None for the default")
  return requested


def dot(a, b, trans_a=False, trans_b=False):
  """a @ b with float32 accumulation; float32 operands use full precision (no TF32)."""
  dims = (((0 if trans_a else 1,), (1 if trans_b else 0,)), ((), ()))
  precision = lax.Precision.HIGHEST if a.dtype == jnp.float32 else None
  return lax.dot_general(a, b, dims, precision=precision, preferred_element_type=jnp.float32)


def visible(spec: MaskSpec, q_meta, k_meta, k_start, k_len: int):
  """[block_q, block_k] mask of a PARTIAL tile: the predicate on the real metadata, and
  no key slot past the real length."""
  (qp, qs, qg), (kp, ks, kg) = q_meta, k_meta
  ok = spec.allowed(qp[:, None], kp[None, :], qs[:, None], ks[None, :], qg[:, None], kg[None, :])
  k_idx = k_start + lax.broadcasted_iota(jnp.int32, (1, kp.shape[0]), 1)
  return ok & (k_idx < k_len)


def walk(table_ref, body, carry):
  """Run body(tile, carry, masked) over the FULL then the PARTIAL entries of a table row."""
  n_full, n_partial = table_ref[0], table_ref[1]
  carry = lax.fori_loop(0, n_full, lambda i, c: body(table_ref[2 + i], c, False), carry)
  return lax.fori_loop(n_full, n_full + n_partial,
                       lambda i, c: body(table_ref[2 + i], c, True), carry)


def num_warps(head_dim: int) -> int:
  """Warps of the training kernels: more for the larger head dims' tiles."""
  return 4 if head_dim <= 64 else 8


def compiler_params(head_dim: int, stages: int = NUM_STAGES):
  """Triton launch settings of the training kernels."""
  return plgpu.CompilerParams(num_warps=num_warps(head_dim), num_stages=stages)


def pad_len(x, length: int):
  """x zero-padded along axis 1 (the sequence) to `length`: whole tiles."""
  pad = [(0, 0)] * x.ndim
  pad[1] = (0, length - x.shape[1])
  return jnp.pad(x, pad)
