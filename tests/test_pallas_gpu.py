"""The block-sparse Pallas GPU kernel (interpret mode on CPU) against the dense reference.

Tolerances (the kernel sums in another order than the reference, in float32 throughout):
  float32 inputs   outputs and gradients within 2e-5 (absolute + relative)
  bfloat16 inputs  against the float32 reference on the same (rounded) inputs: outputs
                   within 2e-2, gradients within 5e-2 of the largest gradient entry
Rows with no visible key are compared separately: the kernel returns 0 there (the reference
returns the mean of v), so the losses below give those rows zero weight.

Each compiled (mask, shape, dtype) costs ~10 s of interpretation set-up on CPU, so the
shapes are small and several metadata draws reuse one compilation.
"""

import numpy as np
import pytest

import jax
import jax.numpy as jnp

from cardjax.attention import MaskSpec, dense_mask, reference_attention
from cardjax.attention import pallas_gpu as pg
from cardjax.attention.tiles import row_layout, tile_table

F32_TOL = 2e-5
# The interpreted kernels are large programs that run for milliseconds: XLA's CPU
# optimisations would cost most of the test time (about half of each compilation).
FAST_COMPILE = {"xla_backend_optimization_level": 0, "xla_llvm_disable_expensive_passes": True}


def packed_meta(kind, length, documents, padding, batch=1):
  """row_layout's row with the last `padding` data tokens turned into pipeline padding
  (segment 0, position 0) in every stream, repeated over the batch."""
  pos, streams, seg = (np.array(x, np.int32) for x in row_layout(kind, length, documents))
  if padding:
    halves = 2 if kind in ("dual_stream", "bd3lm") else 1
    for h in range(halves):
      tail = slice((h + 1) * length - padding, (h + 1) * length)
      pos[tail], seg[tail] = 0, 0
  return tuple(jnp.asarray(np.repeat(x[None], batch, 0)) for x in (pos, streams, seg))


def inputs(key, b, tq, tk, h, kvh, d, dtype=jnp.float32):
  kq, kk, kv, kw = jax.random.split(key, 4)
  q = jax.random.normal(kq, (b, tq, h, d), jnp.float32).astype(dtype)
  k = jax.random.normal(kk, (b, tk, kvh, d), jnp.float32).astype(dtype)
  v = jax.random.normal(kv, (b, tk, kvh, d), jnp.float32).astype(dtype)
  w = jax.random.normal(kw, (b, tq, h, d), jnp.float32)
  return q, k, v, w


def seen(spec, q_meta, k_meta):
  """[b, tq, 1, 1] float: 1 where the query row sees at least one key."""
  return dense_mask(spec, q_meta, k_meta).any(-1)[:, :, None, None].astype(jnp.float32)


def value_and_grads(fn, spec):
  """jit(meta, q, k, v, w -> (out, (dq, dk, dv))) for the loss sum(out * w) over rows
  that see a key."""
  def loss(q, k, v, w, q_meta, k_meta):
    out = fn(q, k, v, spec, q_meta, k_meta)
    return jnp.sum(out.astype(jnp.float32) * w * seen(spec, q_meta, k_meta)), out

  grad = jax.grad(loss, argnums=(0, 1, 2), has_aux=True)
  return jax.jit(lambda q, k, v, w, qm, km: grad(q, k, v, w, qm, km)[::-1],
                 compiler_options=FAST_COMPILE)


def kernel(block_q, block_k):
  return lambda q, k, v, spec, qm, km: pg.pallas_gpu_attention(
      q, k, v, spec, qm, km, interpret=True, block_q=block_q, block_k=block_k)


def assert_matches(spec, q, k, v, w, q_meta, k_meta, blocks=(16, 32), rtol=F32_TOL, atol=F32_TOL,
                   fns=None):
  got_fn, ref_fn = fns or (value_and_grads(kernel(*blocks), spec),
                           value_and_grads(reference_attention, spec))
  out, grads = got_fn(q, k, v, w, q_meta, k_meta)
  f32 = [x.astype(jnp.float32) for x in (q, k, v)]
  ref_out, ref_grads = ref_fn(*f32, w, q_meta, k_meta)
  rows = np.asarray(seen(spec, q_meta, k_meta))
  np.testing.assert_allclose(np.asarray(out, np.float32) * rows, np.asarray(ref_out) * rows,
                             rtol=rtol, atol=atol, err_msg="output")
  for name, g, r in zip(("dq", "dk", "dv"), grads, ref_grads):
    g, r = np.asarray(g, np.float32), np.asarray(r)
    np.testing.assert_allclose(g, r, rtol=rtol, atol=atol * max(1.0, np.abs(r).max()),
                               err_msg=name)
  return got_fn, ref_fn


# (spec, data tokens per stream, packed documents, padding tokens, kv heads, GQA ratio, d)
CASES = [(MaskSpec("causal"), 45, 2, 5, 1, 7, 16),
         (MaskSpec("bidirectional"), 37, 3, 4, 2, 2, 32),
         (MaskSpec("dual_stream", 4), 27, 2, 3, 1, 2, 16),
         (MaskSpec("bd3lm", 8), 25, 2, 2, 2, 1, 16),
         (MaskSpec("block_causal", 4), 50, 2, 6, 1, 1, 32)]


@pytest.mark.parametrize("spec,length,docs,padding,kvh,ratio,d", CASES,
                         ids=[c[0].kind for c in CASES])
def test_matches_reference_on_packed_rows(spec, length, docs, padding, kvh, ratio, d):
  """Every mask kind, packed documents with padding, lengths that are not tile multiples,
  GQA ratios 1, 2 and 7: outputs and dq, dk, dv equal the dense reference in float32."""
  meta = packed_meta(spec.kind, length, docs, padding, batch=2)
  t = meta[0].shape[1]
  q, k, v, w = inputs(jax.random.key(length), 2, t, t, kvh * ratio, kvh, d)
  assert_matches(spec, q, k, v, w, meta, meta)


def test_exact_for_arbitrary_metadata():
  """Random positions, streams and segments (no layout contract at all), cross-attention
  lengths: the tables stay conservative, so the kernel still equals the reference (the
  dual stream rule has the most cases; test_device_table_is_sound_and_tight covers the
  tables of every kind)."""
  spec, tq, tk = MaskSpec("dual_stream", 4), 40, 56
  q, k, v, w = inputs(jax.random.key(1), 2, tq, tk, 2, 1, 16)
  fns = None
  for seed in range(3):
    rng = np.random.default_rng(seed)

    def meta(n):
      return (jnp.asarray(np.sort(rng.integers(0, 24, (2, n)), axis=1), jnp.int32),
              jnp.asarray(rng.integers(0, 2, (2, n)), jnp.int32),
              jnp.asarray(np.sort(rng.integers(0, 3, (2, n)), axis=1), jnp.int32))

    fns = assert_matches(spec, q, k, v, w, meta(tq), meta(tk), fns=fns)


def test_bfloat16_inputs():
  """bf16 inputs, float32 accumulation: close to the float32 reference on the same values."""
  spec = MaskSpec("dual_stream", 4)
  meta = packed_meta("dual_stream", 30, 2, 2)
  t = meta[0].shape[1]
  q, k, v, w = inputs(jax.random.key(3), 1, t, t, 4, 2, 32, jnp.bfloat16)
  got_fn = value_and_grads(kernel(16, 16), spec)
  out, grads = got_fn(q, k, v, w, meta, meta)
  assert out.dtype == jnp.bfloat16 and all(g.dtype == jnp.bfloat16 for g in grads)
  assert_matches(spec, q, k, v, w, meta, meta, rtol=2e-2, atol=5e-2,
                 fns=(got_fn, value_and_grads(reference_attention, spec)))


def test_rows_with_no_visible_key_give_zeros_and_zero_gradient():
  """Queries whose segment has no key (cross attention) see nothing: output 0, no NaN,
  and they pass no gradient to q, k or v."""
  spec = MaskSpec("causal")
  tq, tk = 24, 40
  q_meta = (jnp.arange(tq, dtype=jnp.int32)[None] + 16,
            jnp.zeros((1, tq), jnp.int32),
            jnp.asarray([[1] * 12 + [2] * 12], jnp.int32))
  k_meta = (jnp.arange(tk, dtype=jnp.int32)[None], jnp.zeros((1, tk), jnp.int32),
            jnp.ones((1, tk), jnp.int32))
  q, k, v, _ = inputs(jax.random.key(4), 1, tq, tk, 2, 2, 16)

  def loss(q, k, v):  # only the rows that see nothing carry loss
    out = pg.pallas_gpu_attention(q, k, v, spec, q_meta, k_meta, interpret=True,
                                  block_q=16, block_k=16)
    return jnp.sum(out[:, 12:]), out

  step = jax.jit(jax.value_and_grad(loss, argnums=(0, 1, 2), has_aux=True),
                 compiler_options=FAST_COMPILE)
  (_, out), (dq, dk, dv) = step(q, k, v)
  assert np.isfinite(np.asarray(out)).all()
  np.testing.assert_array_equal(np.asarray(out[:, 12:]), 0.0)
  assert np.abs(np.asarray(out[:, :12])).max() > 0.1  # the visible rows are real outputs
  for g in (dq, dk, dv):
    np.testing.assert_array_equal(np.asarray(g), 0.0)


def dense_tile_reduction(spec, q_meta, k_meta, bq, bk):
  """(any visible, all visible) per tile of the reference's dense mask, one row."""
  ok = np.asarray(dense_mask(spec, q_meta, k_meta))[0]
  tq, tk = ok.shape
  nq, nk = -(-tq // bq), -(-tk // bk)
  padded = np.zeros((nq * bq, nk * bk), bool)
  padded[:tq, :tk] = ok
  real = np.zeros_like(padded)
  real[:, :tk] = True  # padded query rows never matter; padded keys are never visible
  tiles = padded.reshape(nq, bq, nk, bk)
  return tiles.any(axis=(1, 3)), (tiles | ~real.reshape(nq, bq, nk, bk)).all(axis=(1, 3)) & (
      real.reshape(nq, bq, nk, bk).all(axis=(1, 3)))


@pytest.mark.parametrize("spec", [MaskSpec("causal"), MaskSpec("bidirectional"),
                                  MaskSpec("dual_stream", 4), MaskSpec("bd3lm", 8),
                                  MaskSpec("block_causal", 4)], ids=lambda s: s.kind)
def test_device_table_is_sound_and_tight(spec):
  """EMPTY only where the dense mask has no visible pair, FULL only where every pair is
  visible (so skipping and unmasked tiles are exact); on one-document rows it equals the
  host tile table of cardjax/attention/tiles.py tile for tile."""
  for length, docs, padding, bq, bk in [(61, 3, 5, 16, 8), (96, 1, 0, 16, 16), (40, 2, 0, 8, 16)]:
    meta = packed_meta(spec.kind, length, docs, padding)
    got = np.asarray(pg.tile_classes(spec, meta, meta, bq, bk))[0]
    any_v, all_v = dense_tile_reduction(spec, meta, meta, bq, bk)
    assert not (any_v & (got == pg.EMPTY)).any(), "a visible pair in an EMPTY tile"
    assert not (~all_v & (got == pg.FULL)).any(), "an invisible pair in a FULL tile"
    if docs == 1 and not padding:
      host = tile_table(spec, [np.asarray(x)[0] for x in meta],
                        [np.asarray(x)[0] for x in meta], bq, bk)
      np.testing.assert_array_equal(got, host)


def test_mars_table_skips_the_clean_to_noisy_quarter_and_out_of_block_tiles():
  """MARS dual stream, L = 512, B = 4, tile 128: the device table visits neither clean ->
  noisy tiles nor noisy -> noisy tiles off the diagonal."""
  spec, length, tile = MaskSpec("dual_stream", 4), 512, 128
  meta = packed_meta("dual_stream", length, 1, 0)
  got = np.asarray(pg.tile_classes(spec, meta, meta, tile, tile))[0]
  half = length // tile
  assert (got[:half, half:] == pg.EMPTY).all()
  noisy = got[half:, half:]
  assert (noisy[~np.eye(half, dtype=bool)] == pg.EMPTY).all()
  assert pg.visit_fractions(got)["skipped"] >= 0.25 + 0.25 * (1 - 1 / half)


def test_visit_table_lists_full_then_partial_tiles_only():
  classes = jnp.asarray([[[0, 2, 1, 2, 0], [0, 0, 0, 0, 0]]], jnp.int32)
  table = np.asarray(pg.visit_table(classes))
  assert table.shape == (1, 2, 8)
  np.testing.assert_array_equal(table[0, 0, :2], [2, 1])
  np.testing.assert_array_equal(table[0, 0, 2:5], [1, 3, 2])  # FULL 1, 3 then PARTIAL 2
  np.testing.assert_array_equal(table[0, 1, :2], [0, 0])


@pytest.mark.parametrize("d,ratio,dtype", [(64, 7, jnp.bfloat16), (128, 2, jnp.float32)])
def test_lowers_through_triton_without_a_gpu(d, ratio, dtype):
  """The real (non-interpret) forward and backward lower to three Triton custom calls for
  CUDA: every primitive in the kernels has a Triton rule and every tile shape is legal."""
  spec = MaskSpec("dual_stream", 4)
  meta = packed_meta("dual_stream", 150, 2, 4)  # 300 tokens: padded blocks not powers of two
  t = meta[0].shape[1]
  q, k, v, _ = inputs(jax.random.key(5), 1, t, t, ratio, 1, d, dtype)

  def grads(q, k, v, meta):
    return jax.grad(lambda q, k, v: pg.pallas_gpu_attention(
        q, k, v, spec, meta, meta, interpret=False).astype(jnp.float32).sum(),
        argnums=(0, 1, 2))(q, k, v)

  text = pg.lower_for_gpu(grads, q, k, v, meta)
  assert text.count("__gpu$xla.gpu.triton") == 3
  for name in ("fwd", "dq", "dkv"):
    assert f"cardjax_block_sparse_attention_{name}" in text


def test_unsupported_reason():
  assert pg.unsupported_reason(MaskSpec("causal"), 100, 100, 64) is None
  assert pg.unsupported_reason(MaskSpec("dual_stream", 4), 8192, 8192, 128) is None
  assert "head_dim 96" in pg.unsupported_reason(MaskSpec("causal"), 10, 10, 96)
  assert "attention_impl='xla'" in pg.unsupported_reason(MaskSpec("causal"), 10, 10, 256)
  assert "MaskSpec" in pg.unsupported_reason("causal", 10, 10, 64)
  assert "empty" in pg.unsupported_reason(MaskSpec("causal"), 0, 10, 64)


def test_bad_input_errors():
  spec = MaskSpec("causal")
  meta = tuple(np.asarray(x) for x in packed_meta("causal", 16, 1, 0))
  # numpy inputs: every check must fire before any device work
  q, k, v = (np.zeros((1, 16, h, 16), np.float32) for h in (4, 2, 2))
  call = pg.pallas_gpu_attention
  with pytest.raises(ValueError, match="not a multiple of 3 kv heads"):
    call(q, k[:, :, :1].repeat(3, 2), v[:, :, :1].repeat(3, 2), spec, meta, meta)
  with pytest.raises(ValueError, match="head_dim 24"):
    call(*(np.zeros((1, 16, h, 24), np.float32) for h in (4, 2, 2)), spec, meta, meta)
  with pytest.raises(ValueError, match="share one dtype"):
    call(q.astype(np.float16), k, v, spec, meta, meta)
  with pytest.raises(ValueError, match=r"integer \[batch, length\]"):
    call(q, k, v, spec, meta, tuple(x[:, :8] for x in meta))
  with pytest.raises(ValueError, match="positions, streams, segment_ids"):
    call(q, k, v, spec, meta[:2], meta)
  with pytest.raises(ValueError, match="power of two"):
    call(q, k, v, spec, meta, meta, block_q=24)
  with pytest.raises(ValueError, match=r"\[batch, length, heads, head_dim\]"):
    call(q[0], k, v, spec, meta, meta)


def test_tile_tables_are_built_once_per_forward_not_per_layer(monkeypatch):
  """Every layer calls the kernel with the same metadata, so its tile tables are the same
  arrays: the compiled forward builds them once, whatever the depth (XLA's CSE merges the
  unrolled layers' copies; loop-invariant code motion lifts them out of a scan). Counted
  on XLA:CPU by the ops whose source is the table code."""
  import re

  from flax import nnx

  from cardjax.model import ModelConfig, create_model

  monkeypatch.setenv("CARDJAX_ATTENTION_INTERPRET", "1")
  table_ops = re.compile(r"tile_classes|_summaries|visit_table")

  def table_ops_outside_loops(layers, scan):
    """(ops from the table code, those of them inside a loop body (not the top level or
    a fusion or reducer it calls), matmuls inside loop bodies)."""
    cfg = ModelConfig(vocab_size=64, hidden_size=32, intermediate_size=64, num_layers=layers,
                      num_heads=2, num_kv_heads=1, head_dim=16, attention_impl="pallas_gpu",
                      scan_layers=scan)
    graphdef, state = nnx.split(create_model(cfg, seed=0))
    fn = lambda s, t, p, g: nnx.merge(graphdef, s)(t, positions=p, segment_ids=g).sum()
    meta = jnp.ones((1, 64), jnp.int32)  # arguments, so the tables cannot be folded away
    hlo = jax.jit(fn).lower(state, meta, meta, meta).compile().as_text()
    computations = {}
    for text in hlo.split("\n\n"):
      head = text.lstrip().split(" ")
      if head[0].startswith("%") or head[0] == "ENTRY":
        computations[head[1] if head[0] == "ENTRY" else head[0]] = text
    # What the top level reaches through fusions and reducers, not through a loop's body.
    entry = next(n for n, c in computations.items() if c.lstrip().startswith("ENTRY"))
    top, todo = set(), [entry]
    while todo:
      name = todo.pop()
      if name not in top:
        top.add(name)
        todo += re.findall(r"(?:calls|to_apply)=(%[\w.\-]+)", computations.get(name, ""))
    loops = "\n".join(c for n, c in computations.items() if n not in top)
    return len(table_ops.findall(hlo)), len(table_ops.findall(loops)), loops.count(" dot(")

  one, inner, _ = table_ops_outside_loops(1, False)
  assert one > 0 and inner == 0
  assert table_ops_outside_loops(3, False)[:2] == (one, 0)  # CSE: not 3 copies
  total, inner, loop_matmuls = table_ops_outside_loops(3, True)
  assert (total, inner) == (one, 0) and loop_matmuls > 0  # the layers loop, the tables not
