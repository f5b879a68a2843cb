"""The flash-decoding Pallas kernel (interpret mode on CPU) against xla's cache_attention.

Tolerances (the kernel sums in another order than the reference, float32 throughout):
  float32 inputs            outputs within 1e-5 (absolute + relative)
  bfloat16 / float16 inputs against the float32 reference on the same (rounded) inputs:
                            within 2e-2 (the probabilities are rounded to the input dtype
                            before the p @ v product, as in every flash kernel)
Rows with no visible key are compared separately: the kernel returns exactly 0 there (the
reference returns the mean of v).

The cache metadata is built the way the decoders build it (cardjax/decoding, KVCache):
left-padded prompts (segment 0 on the padding), a per-row write index, the window's own
tokens written at it before attention, segment -1 on every slot not written. The slots
wholly past a row's last written slot hold NaN keys and values, so a kernel that loads
one of those tiles fails the comparison: that is the check that they are skipped.

Each compiled (mask, shape, dtype, splits) costs a few seconds of interpretation set-up on
CPU, so the shapes are small and the cases few.
"""

import functools

import numpy as np
import pytest

import jax
import jax.numpy as jnp

from cardjax.attention import MaskSpec, cache_attention, dense_mask
from cardjax.attention import pallas_decode as pd
from cardjax.attention.masks import CLEAN, NOISY
from cardjax.attention.pallas_gpu import lower_for_gpu
from cardjax.model.cache import EMPTY_SEGMENT

F32_TOL = 1e-5
LOW_TOL = 2e-2
SLOTS, BLOCK_K = 100, 32  # 100 slots: the last key tile is partial
# The interpreted kernel is a large program that runs for milliseconds: XLA's CPU
# optimisations would cost most of the test time (as in tests/test_pallas_gpu.py).
FAST_COMPILE = {"xla_backend_optimization_level": 0, "xla_llvm_disable_expensive_passes": True}


@functools.lru_cache(maxsize=None)
def kernel(spec, num_splits):
  """One jitted interpret-mode kernel per (spec, splits): equal shapes reuse its compile."""
  return jax.jit(lambda q, k, v, qm, km: pd.pallas_decode_attention(
      q, k, v, spec, qm, km, interpret=True, block_k=BLOCK_K, num_splits=num_splits),
      compiler_options=FAST_COMPILE)


# --------------------------------------------------------------------------- metadata


def empty_cache(b, slots=SLOTS):
  """KVCache.create's metadata: positions and streams 0, segment -1 everywhere."""
  return [np.zeros((b, slots), np.int32), np.zeros((b, slots), np.int32),
          np.full((b, slots), EMPTY_SEGMENT, np.int32)]


def write(cache, index, window):
  """KVCache.write_meta with a per-row index: the window's [b, t] metadata at
  [index[r], index[r] + t) of row r."""
  for r, i in enumerate(index):
    for c, w in zip(cache, window):
      c[r, i:i + w.shape[1]] = w[r]
  return cache


def left_padded(lengths, width):
  """decoding.prompts.left_pad's metadata: real tokens at positions 0..n-1, segment 1;
  the padding in front has position 0, segment 0."""
  pos, seg = np.zeros((len(lengths), width), np.int32), np.zeros((len(lengths), width), np.int32)
  for r, n in enumerate(lengths):
    pos[r, width - n:], seg[r, width - n:] = np.arange(n), 1
  return [pos, np.zeros_like(pos), seg]


def decoded(lengths, width, generated):
  """A cache after a left-padded prefill and `generated[r]` more tokens in row r (each
  row its own index, as MARS keeps it): (cache, index, next position per row)."""
  cache = write(empty_cache(len(lengths)), [0] * len(lengths), left_padded(lengths, width))
  index = [width + g for g in generated]
  for r, (n, g) in enumerate(zip(lengths, generated)):
    cache[0][r, width:width + g], cache[2][r, width:width + g] = np.arange(n, n + g), 1
  return cache, index, [n + g for n, g in zip(lengths, generated)]


def window(starts, width, stream):
  """[b, width] metadata of fresh tokens at positions start.. of one stream, segment 1."""
  pos = np.asarray(starts, np.int32)[:, None] + np.arange(width, dtype=np.int32)
  return [pos, np.full_like(pos, stream), np.ones_like(pos)]


def ar_step():  # causal, tq 1: one token after the prompt and what was generated
  cache, index, nxt = decoded([30, 11], 32, [7, 19])
  q = window(nxt, 1, CLEAN)
  return q, write(cache, index, q)


def prefill():  # causal, tq 40: left-padded prompts into an empty cache
  q = left_padded([40, 23], 40)
  return q, write(empty_cache(2), [0, 0], q)


def mars_window(block=4):
  """dual_stream, tq = 1 + B: [the pending clean token | B noisy masks] over a clean cache
  (the pending token's key is written with the window, as MARS does)."""
  cache, index, nxt = decoded([21, 9], 24, [11, 2])
  pending = window([n - 1 for n in nxt], 1, CLEAN)
  masks = window(nxt, block, NOISY)
  q = [np.concatenate(x, axis=1) for x in zip(pending, masks)]
  return q, write(cache, [i - 1 for i in index], q)


def noisy_block(width, stream):
  """A block of `width` fresh tokens (one stream) after the cache: block diffusion, MDLM."""
  cache, index, nxt = decoded([13, 6], 16, [0, 10])
  q = window(nxt, width, stream)
  return q, write(cache, index, q)


def as_jnp(meta):
  return tuple(jnp.asarray(x) for x in meta)


def inputs(key, b, tq, h, kvh, d, dtype=jnp.float32, slots=SLOTS):
  kq, kk, kv = jax.random.split(key, 3)
  return (jax.random.normal(kq, (b, tq, h, d), jnp.float32).astype(dtype),
          jax.random.normal(kk, (b, kvh, slots, d), jnp.float32).astype(dtype),
          jax.random.normal(kv, (b, kvh, slots, d), jnp.float32).astype(dtype))


def poison_unwritten_tiles(k, v, k_meta, tile=BLOCK_K):
  """k, v with NaN in every key tile (of `tile` slots) wholly past each row's last
  written slot."""
  seg = np.asarray(k_meta[2])
  k, v = np.array(k, np.float32), np.array(v, np.float32)
  for r in range(seg.shape[0]):
    written = np.nonzero(seg[r] != EMPTY_SEGMENT)[0]
    end = -(-(written.max() + 1 if written.size else 0) // tile) * tile
    k[r, :, end:], v[r, :, end:] = np.nan, np.nan
  return jnp.asarray(k), jnp.asarray(v)


def assert_matches(spec, q, k, v, q_meta, k_meta, num_splits=1, tol=F32_TOL, poison=True,
                   run=None, tile=BLOCK_K):
  """The kernel (`run`, default this file's pallas_decode with `num_splits`) equals
  cache_attention (float32, on the same rounded inputs) on every row that sees a key and
  returns exactly 0 on the others."""
  bad_k, bad_v = poison_unwritten_tiles(k, v, k_meta, tile) if poison else (k, v)
  run = run or kernel(spec, num_splits)
  out = run(q, bad_k.astype(k.dtype), bad_v.astype(v.dtype), q_meta, k_meta)
  assert out.dtype == q.dtype and out.shape == q.shape
  ref = cache_attention(*(x.astype(jnp.float32) for x in (q, k, v)), spec, q_meta, k_meta)
  out, ref = np.asarray(out, np.float32), np.asarray(ref)
  seen = np.asarray(dense_mask(spec, q_meta, k_meta).any(-1))
  np.testing.assert_allclose(out[seen], ref[seen], rtol=tol, atol=tol)
  np.testing.assert_array_equal(out[~seen], 0.0)
  return seen


# --------------------------------------------------------------------------- numerics

# (spec, metadata builder, heads, kv heads, head_dim, splits)
CASES = [
    ("ar_step", MaskSpec("causal"), ar_step, 7, 1, 16, 2),
    ("prefill", MaskSpec("causal"), prefill, 4, 2, 32, 1),
    ("mars_window", MaskSpec("dual_stream", 4), mars_window, 2, 2, 16, 1),
    ("mdlm_block", MaskSpec("bidirectional"), lambda: noisy_block(5, CLEAN), 4, 2, 16, 3),
    ("bd3lm_block", MaskSpec("bd3lm", 8), lambda: noisy_block(8, NOISY), 2, 2, 32, 1),
    ("card_block", MaskSpec("block_causal", 4), lambda: noisy_block(4, CLEAN), 7, 1, 16, 2),
]


@pytest.mark.parametrize("name,spec,build,h,kvh,d,splits", CASES, ids=[c[0] for c in CASES])
def test_matches_cache_attention_on_decoder_metadata(name, spec, build, h, kvh, d, splits):
  """Every mask kind over the caches the decoders build: tq 1, 4, 5, 8 and 40, GQA
  ratios 1, 2 and 7, 100 slots in tiles of 32, one and several splits; the NaN keys and
  values in the unwritten tiles are never read."""
  q_meta, k_meta = (as_jnp(m) for m in build())
  q, k, v = inputs(jax.random.key(len(name)), 2, q_meta[0].shape[1], h, kvh, d)
  seen = assert_matches(spec, q, k, v, q_meta, k_meta, splits)
  assert seen.all()  # every decoder query sees at least its prompt


def random_meta(rng, b, n, empty_share=0.0):
  """Arbitrary metadata: sorted random positions, random streams and segments, a share of
  the slots empty."""
  seg = np.sort(rng.integers(0, 3, (b, n)), axis=1)
  seg[rng.random((b, n)) < empty_share] = EMPTY_SEGMENT
  return (np.sort(rng.integers(0, 24, (b, n)), axis=1).astype(np.int32),
          rng.integers(0, 2, (b, n)).astype(np.int32), seg.astype(np.int32))


def test_exact_for_arbitrary_metadata():
  """Random positions, streams, segments and empty slots (no layout contract): the tile
  ranges stay conservative, so the kernel still equals the reference (dual_stream has the
  most rules; test_key_tile_ranges_are_sound covers the ranges of every kind)."""
  spec = MaskSpec("dual_stream", 4)
  q, k, v = inputs(jax.random.key(1), 2, 5, 4, 2, 16)
  for seed in range(3):
    rng = np.random.default_rng(seed)
    q_meta, k_meta = as_jnp(random_meta(rng, 2, 5)), as_jnp(random_meta(rng, 2, SLOTS, 0.3))
    assert_matches(spec, q, k, v, q_meta, k_meta, num_splits=3, poison=False)


@pytest.mark.parametrize("splits", [1, 3])
def test_rows_with_no_visible_key_give_zeros(splits):
  """Queries of a segment the cache does not hold, and a row whose cache is empty (its key
  range is empty: no tile is loaded), return exactly 0, with one split and merged."""
  spec = MaskSpec("dual_stream", 4)
  q, k, v = inputs(jax.random.key(2), 2, 5, 4, 2, 16)
  k_meta = empty_cache(2)
  k_meta[0][0, :40], k_meta[2][0, :40] = np.arange(40), 1
  q_meta = [np.full((2, 5), 50, np.int32), np.zeros((2, 5), np.int32),
            np.asarray([[1, 1, 2, 2, 2], [1] * 5], np.int32)]
  seen = assert_matches(spec, q, k, v, as_jnp(q_meta), as_jnp(k_meta), num_splits=splits)
  np.testing.assert_array_equal(seen, [[True, True, False, False, False], [False] * 5])


@pytest.mark.parametrize("dtype", [jnp.bfloat16, jnp.float16], ids=["bf16", "fp16"])
def test_low_precision_inputs(dtype):
  """bf16 / fp16 inputs, float32 softmax and accumulation: output in the input dtype,
  close to the float32 reference on the same values."""
  q_meta, k_meta = (as_jnp(m) for m in mars_window())
  q, k, v = inputs(jax.random.key(3), 2, 5, 4, 2, 32, dtype)
  assert_matches(MaskSpec("dual_stream", 4), q, k, v, q_meta, k_meta, num_splits=2,
                 tol=LOW_TOL)


# --------------------------------------------------------------------------- skipping

KINDS = [MaskSpec("causal"), MaskSpec("bidirectional"), MaskSpec("dual_stream", 4),
         MaskSpec("bd3lm", 8), MaskSpec("block_causal", 4)]


@pytest.mark.parametrize("spec", KINDS, ids=lambda s: s.kind)
def test_key_tile_ranges_are_sound(spec):
  """Every key a query sees lies in its row tile's range of key tiles, on decoder and on
  arbitrary metadata, for GQA folds that put several queries and heads in one row tile."""
  rng = np.random.default_rng(0)
  metas = [ar_step(), prefill(), mars_window(), noisy_block(8, NOISY)]
  metas += [(random_meta(rng, 2, 7), random_meta(rng, 2, SLOTS, 0.3)) for _ in range(3)]
  for q_meta, k_meta in metas:
    for group, block_r in [(3, 16), (7, 64)]:  # one query's heads across two row tiles
      got = np.asarray(pd.key_tile_ranges(spec, as_jnp(q_meta), as_jnp(k_meta), group,
                                          block_r, BLOCK_K))
      seen = dense_mask(spec, q_meta, k_meta)  # numpy: [b, tq, slots]
      tq = seen.shape[1]
      # the range of (query t, head j) is that of its row tile: row t * group + j
      ranges = got[:, (np.arange(tq)[:, None] * group + np.arange(group)) // block_r]
      tile = np.arange(SLOTS) // BLOCK_K
      inside = (ranges[..., :1] <= tile) & (tile < ranges[..., 1:])  # [b, tq, group, slots]
      assert (inside | ~seen[:, :, None]).all(), (group, block_r, got)


def test_key_tile_ranges_skip_the_unwritten_tail_the_padding_and_the_future():
  """AR step: the range ends at each row's last written slot and starts at its first
  real one (the padding tiles hold segment 0 only); prefill: the causal upper part of the
  prompt is not read by the first row tile."""
  q_meta, k_meta = ar_step()  # rows write slots [2, 40) and [21, 52)
  got = np.asarray(pd.key_tile_ranges(MaskSpec("causal"), as_jnp(q_meta), as_jnp(k_meta),
                                      7, 16, BLOCK_K))
  np.testing.assert_array_equal(got[:, 0], [[0, 2], [0, 2]])
  got = np.asarray(pd.key_tile_ranges(MaskSpec("causal"), as_jnp(q_meta), as_jnp(k_meta),
                                      7, 16, 16))
  np.testing.assert_array_equal(got[:, 0], [[0, 3], [1, 4]])
  q_meta, k_meta = prefill()  # tq 40, 2 heads per kv head: rows of 64 hold 32 queries
  got = np.asarray(pd.key_tile_ranges(MaskSpec("causal"), as_jnp(q_meta), as_jnp(k_meta),
                                      2, 64, 16))
  np.testing.assert_array_equal(got[0], [[0, 2], [0, 3]])  # of 7 tiles of 16 slots


# --------------------------------------------------------------------------- Triton, errors


@pytest.mark.parametrize("dtype", [jnp.float32, jnp.bfloat16], ids=["fp32", "bf16"])
@pytest.mark.parametrize("d", [64, 128])
def test_lowers_through_triton_without_a_gpu(dtype, d):
  """The real (non-interpret) kernel lowers to a Triton custom call for CUDA, both the
  one-split and the split variant (the default for an AR step over 1000 slots): every
  primitive has a Triton rule and every tile shape is legal."""
  spec = MaskSpec("dual_stream", 4)
  b, kvh, slots = 2, 2, 1000
  _, k, v = inputs(jax.random.key(5), b, 1, 14, kvh, d, dtype, slots)
  k_meta = as_jnp(random_meta(np.random.default_rng(5), b, slots, 0.3))

  def both(k, v, k_meta):
    outs = []
    # an AR step (the default: 4 splits) and a prefill-sized window (64-row tiles) in one
    for tq, splits in ((1, None), (40, 1)):
      q = jnp.zeros((b, tq, 14, d), dtype)
      q_meta = tuple(jnp.zeros((b, tq), jnp.int32) for _ in range(3))
      outs.append(pd.pallas_decode_attention(q, k, v, spec, q_meta, k_meta, interpret=False,
                                             num_splits=splits))
    return outs

  text = lower_for_gpu(both, k, v, k_meta)
  assert text.count("__gpu$xla.gpu.triton") == 2
  assert "cardjax_flash_decoding_split" in text and "cardjax_flash_decoding\"" in text


def test_unsupported_reason():
  assert pd.unsupported_reason(MaskSpec("causal"), 1, 100, 64) is None
  assert pd.unsupported_reason(MaskSpec("dual_stream", 4), 512, 8192, 128) is None
  assert "head_dim 96" in pd.unsupported_reason(MaskSpec("causal"), 1, 10, 96)
  assert "cache_attention" in pd.unsupported_reason(MaskSpec("causal"), 1, 10, 256)
  assert "MaskSpec" in pd.unsupported_reason("causal", 1, 10, 64)
  assert "empty" in pd.unsupported_reason(MaskSpec("causal"), 0, 10, 64)
  assert "empty" in pd.unsupported_reason(MaskSpec("causal"), 1, 0, 64)


def test_bad_input_errors():
  """numpy inputs: every check fires before any device work."""
  spec = MaskSpec("causal")
  q_meta = tuple(np.zeros((1, 3), np.int32) for _ in range(3))
  k_meta = tuple(np.zeros((1, 16), np.int32) for _ in range(3))
  q = np.zeros((1, 3, 4, 16), np.float32)
  k = np.zeros((1, 2, 16, 16), np.float32)
  call = pd.pallas_decode_attention
  with pytest.raises(ValueError, match="not a multiple of 3 kv heads"):
    call(q, k[:, :1].repeat(3, 1), k[:, :1].repeat(3, 1), spec, q_meta, k_meta)
  with pytest.raises(ValueError, match="not a multiple of 16 kv heads.*cache's layout"):
    call(q, k.transpose(0, 2, 1, 3), k.transpose(0, 2, 1, 3), spec, q_meta, k_meta)
  with pytest.raises(ValueError, match="head_dim 24"):
    call(q[..., :8].repeat(3, 3), k[..., :8].repeat(3, 3), k[..., :8].repeat(3, 3), spec,
         q_meta, k_meta)
  with pytest.raises(ValueError, match="k and v shapes differ"):
    call(q, k, k[:, :, :8], spec, q_meta, k_meta)
  with pytest.raises(ValueError, match="share one dtype"):
    call(q.astype(np.float16), k, k, spec, q_meta, k_meta)
  with pytest.raises(ValueError, match=r"integer \[batch, slots\] = \[1, 16\]"):
    call(q, k, k, spec, q_meta, tuple(x[:, :8] for x in k_meta))
  with pytest.raises(ValueError, match=r"integer \[batch, tq\]"):
    call(q, k, k, spec, tuple(x.astype(np.float32) for x in q_meta), k_meta)
  with pytest.raises(ValueError, match="positions, streams, segment_ids"):
    call(q, k, k, spec, q_meta[:2], k_meta)
  with pytest.raises(ValueError, match=r"\[batch, tq, heads, head_dim\]"):
    call(q[0], k, k, spec, q_meta, k_meta)
  with pytest.raises(ValueError, match="MaskSpec"):
    call(q, k, k, "causal", q_meta, k_meta)
  with pytest.raises(ValueError, match="power of two"):
    call(q, k, k, spec, q_meta, k_meta, block_k=24)
  with pytest.raises(ValueError, match="num_splits=0"):
    call(q, k, k, spec, q_meta, k_meta, num_splits=0)
