"""Input checks shared by the Pallas kernels: one clear ValueError for bad input before
any device work (numpy inputs included), worded for the layout the kernel reads.

Two layouts: the training kernel (pallas_gpu) takes k, v as [batch, length, kv_heads,
head_dim], like the model's projections; the decode kernels (pallas_decode, tpu_decode)
read the KV cache in place, [batch, kv_heads, slots, head_dim].
"""

from __future__ import annotations

import jax.numpy as jnp

from cardjax.attention.masks import MaskSpec

DTYPES = (jnp.float32, jnp.bfloat16, jnp.float16)


def call_reason(spec, q_len: int, k_len: int, *, cache_layout: bool) -> str | None:
  """Why no kernel serves a call whatever its tiles (a spec that is not a MaskSpec, an
  empty side), or None: the start of every kernel's unsupported_reason."""
  if not isinstance(spec, MaskSpec):
    return f"spec must be a cardjax MaskSpec, got {type(spec).__name__}"
  if cache_layout and (q_len < 1 or k_len < 1):
    return f"empty input (q_len={q_len}, slots={k_len}); pass at least one query and slot"
  if q_len < 1 or k_len < 1:
    return f"empty sequence (q_len={q_len}, k_len={k_len}); pass at least one token"
  return None


def check_inputs(q, k, v, spec, q_meta, k_meta, *, kernel: str, cache_layout: bool,
                 unsupported) -> None:
  """Raise for shapes, dtypes or metadata `kernel` cannot take, then for what
  `unsupported(spec, q_len, k_len, head_dim)` (None, or why not) refuses."""
  if cache_layout:
    q_len, k_len, q_want, kv_want = "tq", "slots", "tq, heads", "kv_heads, slots"
    heads_axis, keys_axis = 1, 2
    layout = " (k, v are [batch, kv_heads, slots, head_dim], the cache's layout)"
  else:
    q_len, k_len, q_want, kv_want = "length", "length", "length, heads", "length, kv_heads"
    heads_axis, keys_axis, layout = 2, 1, ""
  for name, x in (("q", q), ("k", k), ("v", v)):
    if x.ndim != 4:
      raise ValueError(f"{name} must be [batch, {q_want if name == 'q' else kv_want}, "
                       f"head_dim], got shape {x.shape}")
  b, tq, h, d = q.shape
  if k.shape != v.shape:
    raise ValueError(f"k and v shapes differ: {k.shape} vs {v.shape}")
  if k.shape[0] != b or k.shape[3] != d:
    raise ValueError(f"k/v {k.shape} do not match q {q.shape} in batch or head_dim{layout}")
  if h % k.shape[heads_axis]:
    raise ValueError(f"{h} query heads are not a multiple of {k.shape[heads_axis]} kv heads"
                     f"{layout}")
  if not (q.dtype == k.dtype == v.dtype) or q.dtype not in DTYPES:
    raise ValueError(f"q, k, v must share one dtype of {[jnp.dtype(t).name for t in DTYPES]}; "
                     f"got {q.dtype}, {k.dtype}, {v.dtype}")
  for side, meta, axis, n in (("q_meta", q_meta, q_len, tq),
                              ("k_meta", k_meta, k_len, k.shape[keys_axis])):
    if len(meta) != 3:
      raise ValueError(f"{side} must be (positions, streams, segment_ids), got {len(meta)} "
                       "arrays")
    for x in meta:
      if x.shape != (b, n) or not jnp.issubdtype(x.dtype, jnp.integer):
        raise ValueError(f"{side} arrays must be integer [batch, {axis}] = [{b}, {n}], got "
                         f"{x.dtype}{list(x.shape)}")
  reason = unsupported(spec, tq, k.shape[keys_axis], d)
  if reason:
    raise ValueError(f"{kernel} cannot serve this call: {reason}")
