"""Dense XLA attention: the reference every kernel is tested against."""

from __future__ import annotations

import jax
import jax.numpy as jnp

from cardjax.attention.masks import MaskSpec


def dense_mask(spec: MaskSpec, q_meta, k_meta):
  """[batch, q_len, k_len] booleans from (positions, streams, segments) triples."""
  (qp, qs, qg), (kp, ks, kg) = q_meta, k_meta
  return spec.allowed(qp[:, :, None], kp[:, None, :], qs[:, :, None], ks[:, None, :],
                      qg[:, :, None], kg[:, None, :])


def reference_attention(q, k, v, spec: MaskSpec, q_meta, k_meta, scale: float | None = None):
  """Softmax attention with grouped-query heads.

  q: [batch, q_len, heads, head_dim]; k, v: [batch, k_len, kv_heads, head_dim];
  q_meta / k_meta: (positions, streams, segment_ids), each [batch, len] int32.
  Scores and softmax run in float32 whatever the compute dtype.
  """
  b, tq, h, d = q.shape
  kvh = k.shape[2]
  if h % kvh:
    raise ValueError(f"{h} query heads are not a multiple of {kvh} kv heads")
  scale = d ** -0.5 if scale is None else scale
  qg = q.reshape(b, tq, kvh, h // kvh, d)
  scores = jnp.einsum("bqkgd,bskd->bkgqs", qg, k, preferred_element_type=jnp.float32) * scale
  mask = dense_mask(spec, q_meta, k_meta)[:, None, None]
  # A finite fill keeps rows with no visible key (padding) free of NaNs.
  scores = jnp.where(mask, scores, jnp.finfo(jnp.float32).min)
  probs = jax.nn.softmax(scores, axis=-1).astype(v.dtype)
  out = jnp.einsum("bkgqs,bskd->bqkgd", probs, v)
  return out.reshape(b, tq, h, d)


def cache_attention(q, k, v, spec: MaskSpec, q_meta, k_meta, scale: float | None = None):
  """reference_attention over keys and values in the KV cache's layout.

  q: [batch, q_len, heads, head_dim]; k, v: [batch, kv_heads, slots, head_dim] (slots next
  to head_dim, as KVCache stores them). The same math as reference_attention; only the
  small query and output are transposed, never the cache, which each decoding forward
  reads once per layer.
  """
  b, tq, h, d = q.shape
  kvh = k.shape[1]
  if h % kvh:
    raise ValueError(f"{h} query heads are not a multiple of {kvh} kv heads")
  g = h // kvh
  scale = d ** -0.5 if scale is None else scale
  qg = q.reshape(b, tq, kvh, g, d).transpose(0, 2, 3, 1, 4).reshape(b, kvh, g * tq, d)
  scores = jnp.einsum("bkqd,bksd->bkqs", qg, k, preferred_element_type=jnp.float32) * scale
  scores = scores.reshape(b, kvh, g, tq, -1)
  mask = dense_mask(spec, q_meta, k_meta)[:, None, None]
  scores = jnp.where(mask, scores, jnp.finfo(jnp.float32).min)
  probs = jax.nn.softmax(scores, axis=-1).astype(v.dtype).reshape(b, kvh, g * tq, -1)
  out = jnp.einsum("bkqs,bksd->bkqd", probs, v)
  return out.reshape(b, kvh, g, tq, d).transpose(0, 3, 1, 2, 4).reshape(b, tq, h, d)
