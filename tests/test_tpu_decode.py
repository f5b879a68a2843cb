"""The TPU flash-decoding kernel (interpret mode on CPU, and compiled by libtpu for a
compile-only TPU) against xla's cache_attention.

Tolerances as tests/test_pallas_decode.py: float32 within 1e-5; bfloat16 inputs against
the float32 reference on the same rounded inputs within 2e-2. Rows with no visible key
return exactly 0. The caches are built as the decoders build them (that file's helpers),
over 300 slots: two whole key tiles of 128 and a partial one; every tile wholly past a
row's last written slot holds NaN keys and values, so reading one fails the comparison.
"""

import functools

import numpy as np
import pytest

import jax
import jax.numpy as jnp

from cardjax.attention import MaskSpec
from cardjax.attention import tpu_decode as td
from cardjax.attention.masks import CLEAN, NOISY
from test_pallas_decode import (FAST_COMPILE, as_jnp, empty_cache, inputs, left_padded,
                                window, write)
from test_pallas_decode import assert_matches as pallas_decode_check

SLOTS = 300
TILE = td.BLOCK_K


@functools.lru_cache(maxsize=None)
def kernel(spec):
  return jax.jit(lambda q, k, v, qm, km: td.tpu_decode_attention(q, k, v, spec, qm, km,
                                                                 interpret=True),
                 compiler_options=FAST_COMPILE)


def decoded(lengths, width, generated):
  """A left-padded prefill then `generated[r]` more tokens in row r (its own index)."""
  cache = write(empty_cache(len(lengths), SLOTS), [0] * len(lengths),
                left_padded(lengths, width))
  for r, (n, g) in enumerate(zip(lengths, generated)):
    cache[0][r, width:width + g], cache[2][r, width:width + g] = np.arange(n, n + g), 1
  return cache, [width + g for g in generated], [n + g for n, g in zip(lengths, generated)]


def ar_step():  # row 0 ends in tile 1 (tile 2 unwritten), row 1 in the partial tile 2
  cache, index, nxt = decoded([100, 40], 128, [30, 140])
  q = window(nxt, 1, CLEAN)
  return q, write(cache, index, q)


def mars_window(block=4):  # [pending clean | B noisy masks], written at index - 1
  cache, index, nxt = decoded([60, 20], 64, [90, 5])
  q = [np.concatenate(x, axis=1) for x in zip(window([n - 1 for n in nxt], 1, CLEAN),
                                                window(nxt, block, NOISY))]
  return q, write(cache, [i - 1 for i in index], q)


def prefill():  # causal, tq 40, into an empty cache: tiles 1 and 2 are never written
  q = left_padded([40, 23], 40)
  return q, write(empty_cache(2, SLOTS), [0, 0], q)


def assert_matches(spec, q, k, v, q_meta, k_meta, tol=1e-5):
  """test_pallas_decode's check (the reference on rows that see a key, 0 elsewhere, NaN
  tiles past each row's end never read) with this kernel and its 128-slot tiles."""
  return pallas_decode_check(spec, q, k, v, q_meta, k_meta, tol=tol, run=kernel(spec),
                             tile=TILE)


CASES = [  # (name, spec, metadata, heads, kv heads, head_dim, dtype, tolerance)
    ("ar_step", MaskSpec("causal"), ar_step, 9, 3, 64, jnp.float32, 1e-5),
    ("mars_window", MaskSpec("dual_stream", 4), mars_window, 4, 2, 64, jnp.float32, 1e-5),
    ("prefill", MaskSpec("causal"), prefill, 7, 1, 128, jnp.float32, 1e-5),
    ("mars_window_bf16", MaskSpec("dual_stream", 4), mars_window, 9, 3, 64, jnp.bfloat16,
     2e-2),
]


@pytest.mark.parametrize("name,spec,build,h,kvh,d,dtype,tol", CASES, ids=[c[0] for c in CASES])
def test_matches_cache_attention_on_decoder_metadata(name, spec, build, h, kvh, d, dtype, tol):
  """AR step, MARS window and prefill over 300 slots (a partial last tile), GQA 3, 2 and
  7 (SmolLM2's is 3), head dims 64 and 128, float32 and bfloat16; the NaN tiles past each
  row's last written slot are never read."""
  q_meta, k_meta = (as_jnp(m) for m in build())
  q, k, v = inputs(jax.random.key(len(name)), 2, q_meta[0].shape[1], h, kvh, d, dtype,
                   slots=SLOTS)
  assert assert_matches(spec, q, k, v, q_meta, k_meta, tol).all()


def test_rows_with_no_visible_key_give_zeros():
  """A segment the cache does not hold, and a row whose cache is empty: exactly 0."""
  spec = MaskSpec("dual_stream", 4)
  q, k, v = inputs(jax.random.key(2), 2, 5, 4, 2, 64, slots=SLOTS)
  k_meta = empty_cache(2, SLOTS)
  k_meta[0][0, :140], k_meta[2][0, :140] = np.arange(140), 1
  q_meta = [np.full((2, 5), 150, np.int32), np.zeros((2, 5), np.int32),
            np.asarray([[1, 1, 2, 2, 2], [1] * 5], np.int32)]
  seen = assert_matches(spec, q, k, v, as_jnp(q_meta), as_jnp(k_meta))
  np.testing.assert_array_equal(seen, [[True, True, False, False, False], [False] * 5])


def test_refuses_what_it_cannot_tile():
  assert td.unsupported_reason(MaskSpec("causal"), 1, 300, 64) is None
  assert "head_dim 48" in td.unsupported_reason(MaskSpec("causal"), 1, 300, 48)
  q, k, v = inputs(jax.random.key(0), 1, 1, 2, 1, 48, slots=SLOTS)
  meta = as_jnp(ar_step()[0]), as_jnp(ar_step()[1])
  with pytest.raises(ValueError, match="head_dim 48"):
    td.tpu_decode_attention(q, k, v, MaskSpec("causal"), (m[:1] for m in meta[0]),
                            (m[:1] for m in meta[1]), interpret=True)


def compile_for_tpu(head_dim: int, slots: int, dtype=jnp.bfloat16):
  """The kernel (not interpreted) compiled by libtpu for one compile-only v5p chip."""
  from jax.sharding import SingleDeviceSharding

  from cardjax.plan.targets import parse_target, target_devices

  device = target_devices(parse_target("v5p-8"))[0]

  def spec(shape, dt):
    return jax.ShapeDtypeStruct(shape, dt, sharding=SingleDeviceSharding(device))
  b, tq, h, kvh = 16, 5, 9, 3
  cache = spec((b, kvh, slots, head_dim), dtype)
  q_meta = tuple(spec((b, tq), jnp.int32) for _ in range(3))
  k_meta = tuple(spec((b, slots), jnp.int32) for _ in range(3))
  fn = jax.jit(lambda q, k, v, qm, km: td.tpu_decode_attention(
      q, k, v, MaskSpec("dual_stream", 4), qm, km, interpret=False))
  # Mosaic reads the chip's generation from the default device while lowering.
  with jax.default_device(device):
    lowered = fn.lower(spec((b, tq, h, head_dim), dtype), cache, cache, q_meta, k_meta)
  assert "tpu_custom_call" in lowered.as_text()
  return lowered.compile().memory_analysis(), cache


def test_compiles_for_a_compile_only_tpu():
  """libtpu compiles the kernel for a v5p chip from this CPU process: a MARS window of
  16 rows over 1000 slots (a partial last tile), GQA 3. With head_dim 128 the cache is
  read where it lies (the temp memory is far below one copy of k); with 64, as SmolLM2's,
  it compiles too, but a standalone call relays the cache out for the kernel (temp about
  k + v): recorded in docs/attention.md."""
  stats, cache = compile_for_tpu(128, 1000)
  one_copy = np.prod(cache.shape) * 2
  assert stats.temp_size_in_bytes < one_copy / 4, stats
  stats, cache = compile_for_tpu(64, 1000)
  assert stats.temp_size_in_bytes >= np.prod(cache.shape) * 2, stats


def test_in_a_decode_loop_64_wide_heads_keep_the_kernel_layout():
  """Inside a compiled loop of 8 decode steps (write a token's k/v, attend), libtpu keeps
  the cache in the kernel's tiles from step to step: the relayout of 64-wide heads happens
  at the jitted call's entry and exit, never inside the loop body."""
  import re

  from jax.sharding import SingleDeviceSharding

  from cardjax.plan.targets import parse_target, target_devices

  device = target_devices(parse_target("v5p-8"))[0]
  b, h, kvh, slots, d = 16, 9, 3, 1024, 64

  def spec(shape, dt):
    return jax.ShapeDtypeStruct(shape, dt, sharding=SingleDeviceSharding(device))

  def loop(k, v, q, k_meta):
    def body(i, kv):
      k, v = kv
      new = jnp.full((b, kvh, 1, d), 1.0, k.dtype) * i.astype(k.dtype)
      k = jax.lax.dynamic_update_slice(k, new, (0, 0, i, 0))
      v = jax.lax.dynamic_update_slice(v, new, (0, 0, i, 0))
      q_meta = tuple(jnp.full((b, 1), i, jnp.int32) for _ in range(3))
      out = td.tpu_decode_attention(q, k, v, MaskSpec("causal"), q_meta, k_meta,
                                    interpret=False)
      return k + 0 * out.sum().astype(k.dtype), v  # the output feeds the next step
    return jax.lax.fori_loop(0, 8, body, (k, v))

  cache = spec((b, kvh, slots, d), jnp.bfloat16)
  with jax.default_device(device):
    hlo = jax.jit(loop, donate_argnums=(0, 1)).lower(
        cache, cache, spec((b, 1, h, d), jnp.bfloat16),
        tuple(spec((b, slots), jnp.int32) for _ in range(3))).compile().as_text()
  shape = f"bf16[{b},{kvh},{slots},{d}]"
  copy = re.compile(r" copy(-start)?\(")
  in_loop = [line for comp in re.split(r"\n(?=\S)", hlo) if not comp.startswith("ENTRY")
             for line in comp.splitlines() if shape in line and copy.search(line)]
  assert not in_loop, in_loop
  entry = next(comp for comp in re.split(r"\n(?=\S)", hlo) if comp.startswith("ENTRY"))
  assert re.search(re.escape(shape) + r"\S* copy", entry)  # the relayout, at the entry
