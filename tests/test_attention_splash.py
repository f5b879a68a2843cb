"""Splash attention (cardjax/attention/splash.py) against the dense reference, on CPU in
Pallas interpret mode: outputs and gradients (dq, dk, dv of a scalar loss over the real
tokens) for every mask kind, packed documents, padding, GQA ratios 1, 2 and 7, float32 and
bfloat16, lengths that are not multiples of the 128-wide tiles; padding rows give 0; the
layout check; the index-derived mask; shard_map over a (data, tensor) mesh.

Interpret mode is slow (a Python-level grid walk per kernel), so rows stay <= 256 tokens
with one or two rows and few heads.

Tolerances: float32 1e-5 on outputs, 5e-5 on gradients (online vs one-shot softmax);
bfloat16 3e-2 on both (the kernel rounds p to bf16 before p @ v, the reference rounds the
normalised probabilities; q is scaled in bf16 before the kernel)."""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from cardjax.attention import MaskSpec, reference_attention
from cardjax.attention.masks import CLEAN, NOISY
from cardjax.attention.splash import (SpecMask, block_sizes, check_layout, layout_problems,
                                      splash_attention)

TOL = {"float32": (1e-5, 5e-5), "bfloat16": (3e-2, 3e-2)}
TWO = ("dual_stream", "bd3lm")


def rows_meta(kind: str, half: int, docs_per_row, block: int):
  """[rows, T] (positions, streams, segments): each row packs documents of the given
  lengths (block kinds: multiples of B, so they start on block boundaries), then pipeline
  padding (segment 0, position 0) to `half`; two-stream kinds repeat the half as
  [clean | noisy] (dual_stream) or [noisy | clean] (bd3lm)."""
  pos = np.zeros((len(docs_per_row), half), np.int32)
  seg = np.zeros_like(pos)
  for r, docs in enumerate(docs_per_row):
    i = 0
    for s, n in enumerate(docs):
      if kind in ("dual_stream", "bd3lm", "block_causal"):
        assert n % block == 0
      pos[r, i:i + n], seg[r, i:i + n] = np.arange(n), s + 1
      i += n
    assert i <= half
  zeros = np.zeros_like(pos)
  if kind not in TWO:
    return pos, zeros, seg
  a, b = (CLEAN, NOISY) if kind == "dual_stream" else (NOISY, CLEAN)
  return (np.concatenate([pos, pos], 1), np.concatenate([zeros + a, zeros + b], 1),
          np.concatenate([seg, seg], 1))


def qkv(rows: int, t: int, heads: int, kv_heads: int, d: int, dtype, seed: int = 0):
  keys = jax.random.split(jax.random.PRNGKey(seed), 3)
  q = jax.random.normal(keys[0], (rows, t, heads, d), dtype)
  k = jax.random.normal(keys[1], (rows, t, kv_heads, d), dtype)
  v = jax.random.normal(keys[2], (rows, t, kv_heads, d), dtype)
  return q, k, v


CASES = [
    # kind, block B, half length, documents per row, heads, kv_heads, dtype
    ("causal", 0, 100, [(37, 50), (100,)], 2, 2, "float32"),  # 100: not a tile multiple
    ("bidirectional", 0, 128, [(60, 40), (128,)], 4, 2, "float32"),
    ("dual_stream", 4, 64, [(24, 32), (64,)], 7, 1, "float32"),  # GQA 7
    ("bd3lm", 4, 60, [(20, 28)], 4, 2, "bfloat16"),  # 2L = 120: padded to 128
    ("block_causal", 8, 200, [(64, 96, 16)], 2, 2, "bfloat16"),
    ("dual_stream", 8, 96, [(40, 48)], 4, 2, "bfloat16"),
]


@pytest.mark.parametrize("kind,block,half,docs,heads,kv_heads,dtype", CASES)
def test_matches_reference_with_gradients(kind, block, half, docs, heads, kv_heads, dtype):
  spec = MaskSpec(kind, block)
  meta = tuple(jnp.asarray(x) for x in rows_meta(kind, half, docs, block))
  t = meta[0].shape[1]
  q, k, v = qkv(len(docs), t, heads, kv_heads, 16, jnp.dtype(dtype))
  real = meta[2] > 0
  out_tol, grad_tol = TOL[dtype]
  # A fixed random cotangent on the real tokens only: padding carries no loss.
  w = jax.random.normal(jax.random.PRNGKey(9), q.shape, jnp.float32) * real[:, :, None, None]

  def loss(fn):
    return lambda q, k, v: (fn(q, k, v).astype(jnp.float32) * w).sum()

  # Jitted (the metadata is a closed-over constant, so the layout is still checked):
  # eager interpret mode dispatches the kernel's grid op by op.
  splash = lambda q, k, v: splash_attention(q, k, v, spec, meta, meta, interpret=True)
  ref = lambda q, k, v: reference_attention(q, k, v, spec, meta, meta)
  got, want = jax.jit(splash)(q, k, v), ref(q, k, v)
  assert got.dtype == q.dtype and got.shape == q.shape
  got32, want32 = np.asarray(got, np.float32), np.asarray(want, np.float32)
  np.testing.assert_allclose(got32[np.asarray(real)], want32[np.asarray(real)],
                             atol=out_tol, rtol=out_tol)
  assert (got32[~np.asarray(real)] == 0).all()  # padding rows: exactly 0
  g_got = jax.jit(jax.grad(loss(splash), argnums=(0, 1, 2)))(q, k, v)
  g_want = jax.grad(loss(ref), argnums=(0, 1, 2))(q, k, v)
  for name, a, b in zip("qkv", g_got, g_want):
    a32, b32 = np.asarray(a, np.float32), np.asarray(b, np.float32)
    assert np.isfinite(a32).all(), f"d{name} has non-finite entries"
    scale = max(1.0, float(np.abs(b32).max()))
    np.testing.assert_allclose(a32, b32, atol=grad_tol * scale, rtol=grad_tol,
                               err_msg=f"d{name}")


def test_shard_map_over_batch_and_heads():
  """Under a (data=2, tensor=2) mesh the kernel runs per device's rows and heads and
  equals the unsharded reference."""
  from cardjax.parallel import make_mesh

  spec = MaskSpec("causal")
  meta = tuple(jnp.asarray(x) for x in rows_meta("causal", 64, [(30, 34), (64,)], 0))
  q, k, v = qkv(2, 64, 4, 2, 16, jnp.float32)
  mesh = make_mesh(data=2, fsdp=1, tensor=2, devices=jax.devices()[:4])
  with jax.set_mesh(mesh):
    got = jax.jit(lambda q, k, v: splash_attention(q, k, v, spec, meta, meta,
                                                   interpret=True))(q, k, v)
    text = jax.jit(lambda q, k, v: splash_attention(q, k, v, spec, meta, meta,
                                                    interpret=True)).lower(q, k, v).as_text()
  assert "shard_map" in text or "manual" in text.lower()
  np.testing.assert_allclose(np.asarray(got), np.asarray(reference_attention(
      q, k, v, spec, meta, meta)), atol=1e-5)


@pytest.mark.parametrize("kind,block", [("causal", 0), ("bidirectional", 0),
                                        ("dual_stream", 4), ("bd3lm", 4),
                                        ("block_causal", 4)])
def test_index_mask_equals_predicate_on_metadata(kind, block):
  """SpecMask (numpy, as splash's tile scan evaluates it) equals spec.allowed on the real
  metadata of one unpacked row, and its equality/hash identify (spec, half, shape)."""
  spec = MaskSpec(kind, block)
  half = 24
  pos, streams, _ = rows_meta(kind, half, [(half,)], max(block, 1))
  t = pos.shape[1]
  mask = SpecMask(spec, (t, t), half)
  got = mask[0:t, 0:t]
  want = spec.allowed(pos[0][:, None], pos[0][None], streams[0][:, None], streams[0][None],
                      1, 1)
  np.testing.assert_array_equal(got, want)
  assert got.dtype == np.bool_ and got.shape == (t, t)
  assert mask == SpecMask(spec, (t, t), half) and hash(mask) == hash(SpecMask(spec, (t, t),
                                                                              half))
  assert mask != SpecMask(spec, (t, t), half + 1)


def test_layout_check_names_the_problem():
  spec = MaskSpec("dual_stream", 4)
  # A document that starts at index 5 of its half breaks the block alignment.
  pos, streams, seg = rows_meta("dual_stream", 16, [(16,)], 4)
  l = 16
  for h in (0, l):
    seg[0, h:h + 5], pos[0, h:h + 5] = 1, np.arange(5)
    seg[0, h + 5:h + l], pos[0, h + 5:h + l] = 2, np.arange(l - 5)
  problems = layout_problems(spec, (pos, streams, seg), (pos, streams, seg))
  assert any("block boundary" in p for p in problems)
  with pytest.raises(ValueError, match="layout contract.*attention_impl=xla"):
    check_layout(spec, (pos, streams, seg), (pos, streams, seg))
  # Causal needs positions that follow the index; bidirectional needs nothing.
  pos = np.array([[0, 1, 5, 6]], np.int32)
  seg = np.ones_like(pos)
  meta = (pos, np.zeros_like(pos), seg)
  assert layout_problems(MaskSpec("causal"), meta, meta)
  assert not layout_problems(MaskSpec("bidirectional"), meta, meta)
  with pytest.raises(ValueError, match="do not increase by 1"):
    splash_attention(*qkv(1, 4, 2, 2, 16, jnp.float32), MaskSpec("causal"), meta, meta,
                     interpret=True)


def test_bad_calls_are_clear_errors():
  q, k, v = qkv(1, 32, 2, 2, 16, jnp.float32)
  meta = tuple(jnp.asarray(x) for x in rows_meta("causal", 32, [(32,)], 0))
  kmeta = tuple(x[:, :16] for x in meta)
  with pytest.raises(ValueError, match="self-attention.*attention_impl=xla"):
    splash_attention(q, k[:, :16], v[:, :16], MaskSpec("causal"), meta, kmeta,
                     interpret=True)
  with pytest.raises(ValueError, match="multiple of 128"):
    splash_attention(q, k, v, MaskSpec("causal"), meta, meta, interpret=True, block_q=100)
  with pytest.raises(ValueError, match="even row"):
    splash_attention(q[:, :31], k[:, :31], v[:, :31], MaskSpec("dual_stream", 4),
                     tuple(x[:, :31] for x in meta), tuple(x[:, :31] for x in meta),
                     interpret=True)


def test_block_sizes_fit_the_padded_length():
  b = block_sizes(1024)
  assert (b.block_q, b.block_kv, b.block_q_dq, b.block_kv_dkv) == (512, 512, 512, 512)
  b = block_sizes(384)  # 512 does not divide 384: the largest multiple of 128 that does
  assert (b.block_q, b.block_kv, b.block_q_dkv, b.block_kv_dq) == (384, 384, 384, 384)
  b = block_sizes(640, block_q=256, block_kv=256)
  assert (b.block_q, b.block_kv) == (128, 128)
