"""Structured two-stream attention (cardjax/attention/structured.py) against the dense
reference: outputs and gradients on random q/k/v over unpacked, packed (segments not aligned
to the block) and padded rows; the layout check; the dispatcher; and a tiny model on the
inputs the MARS and BD3LM objectives make."""

from __future__ import annotations

import functools

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx

import cardjax.attention as attn
from conftest import packed_batch
from cardjax.attention import MaskSpec, reference_attention, structured_attention
from cardjax.attention.structured import check_layout, layout_problems
from cardjax.config import base_config
from cardjax.model import ModelConfig, create_model
from cardjax.objectives import make_objective

TOL = 1e-5
CLEAN_FIRST = {"dual_stream": True, "bd3lm": False}
SEGMENTS = {8: (3, 5), 12: (5, 3, 3), 24: (7, 9, 5)}  # odd lengths, packed rows


def half_rows(l: int):
  """[4, L] positions / segment ids of one stream, plus which tokens keep the contract:
  row 0 one document filling the row; row 1 one document then pipeline padding (segment 0,
  position 0); row 2 packed odd-length documents then pipeline padding; row 3 packed
  documents starting at positions 2 and 0, then padding whose positions go on counting."""
  pos, seg = np.zeros((4, l), np.int32), np.zeros((4, l), np.int32)
  contract = np.zeros((4, l), bool)
  pos[0], seg[0] = np.arange(l), 1
  pos[1, :l - 3], seg[1, :l - 3] = np.arange(l - 3), 1
  i = 0
  for s, n in enumerate(SEGMENTS[l]):
    pos[2, i:i + n], seg[2, i:i + n] = np.arange(n), s + 1
    i += n
  first = SEGMENTS[l][0] + 1
  pos[3, :first], seg[3, :first] = np.arange(first) + 2, 1
  rest = l - first - 2
  pos[3, first:first + rest], seg[3, first:first + rest] = np.arange(rest), 2
  pos[3, first + rest:] = np.arange(2)  # padding that keeps the contract
  contract[:] = seg > 0
  contract[3] = True
  return pos, seg, contract


def two_stream_meta(kind: str, l: int):
  pos, seg, contract = half_rows(l)
  ones = np.ones_like(pos)
  streams = np.concatenate([0 * ones, ones] if CLEAN_FIRST[kind] else [ones, 0 * ones], axis=1)
  meta = tuple(jnp.asarray(x) for x in (np.concatenate([pos, pos], 1), streams,
                                        np.concatenate([seg, seg], 1)))
  return meta, np.concatenate([contract, contract], 1)


def qkv(l: int, h: int, kvh: int, d: int = 8, seed: int = 0):
  """Random fp32 q, k, v and output weights (numpy: no compile per shape)."""
  rng = np.random.default_rng(seed)
  shapes = [(4, 2 * l, h, d), (4, 2 * l, kvh, d), (4, 2 * l, kvh, d), (4, 2 * l, h, d)]
  return tuple(jnp.asarray(rng.standard_normal(s, np.float32)) for s in shapes)


CASES = [(8, 1, 2, True), (8, 8, 1, False), (12, 2, 1, True), (12, 3, 2, True),
         (24, 3, 1, True), (24, 4, 2, False), (24, 8, 1, True)]


@pytest.mark.parametrize("kind", ["dual_stream", "bd3lm"])
@pytest.mark.parametrize("l,block,kvh,chunked", CASES)
def test_structured_equals_reference(kind, l, block, kvh, chunked):
  spec = MaskSpec(kind, block)
  meta, contract = two_stream_meta(kind, l)
  q, k, v, w = qkv(l, 4, kvh, seed=l * 31 + block)
  keep = jnp.asarray(contract)[:, :, None, None]

  def out_and_grads(fn, q, k, v):
    loss = lambda q, k, v: jnp.sum(fn(q, k, v, spec, meta, meta) * w * keep)
    return fn(q, k, v, spec, meta, meta), jax.grad(loss, argnums=(0, 1, 2))(q, k, v)

  # chunk = B: the smallest band windows, many chunks, L not a multiple of the chunk.
  struct = functools.partial(structured_attention, chunk=block if chunked else None)
  both = jax.jit(lambda q, k, v: (out_and_grads(struct, q, k, v),
                                  out_and_grads(reference_attention, q, k, v)))
  (out_s, grads_s), (out_r, grads_r) = both(q, k, v)
  assert np.isfinite(np.asarray(out_s)).all()  # padding rows too
  np.testing.assert_allclose(np.asarray(out_s)[contract], np.asarray(out_r)[contract],
                             atol=TOL, rtol=TOL)
  for name, gs, gr in zip("qkv", grads_s, grads_r):
    np.testing.assert_allclose(np.asarray(gs), np.asarray(gr), atol=TOL, rtol=TOL,
                               err_msg=f"d/d{name}")


@pytest.mark.parametrize("kind", ["dual_stream", "bd3lm"])
def test_bfloat16_close_to_reference(kind):
  spec = MaskSpec(kind, 4)
  meta, contract = two_stream_meta(kind, 12)
  q, k, v, _ = (x.astype(jnp.bfloat16) for x in qkv(12, 4, 2))
  out_s, out_r = jax.jit(lambda q, k, v: (structured_attention(q, k, v, spec, meta, meta),
                                           reference_attention(q, k, v, spec, meta, meta)))(q, k, v)
  assert out_s.dtype == out_r.dtype == jnp.bfloat16
  np.testing.assert_allclose(np.asarray(out_s, np.float32)[contract],
                             np.asarray(out_r, np.float32)[contract], atol=2e-2, rtol=2e-2)


@pytest.mark.parametrize("kind", ["dual_stream", "bd3lm"])
def test_attend_dispatches_and_skips_the_dense_matrix(kind, monkeypatch):
  spec, l = MaskSpec(kind, 4), 12
  meta, _ = two_stream_meta(kind, l)
  q, k, v, _ = qkv(l, 4, 2)

  def shapes(fn):
    jaxpr = jax.make_jaxpr(fn)(q, k, v)
    return {tuple(var.aval.shape) for eqn in jaxpr.eqns for var in eqn.outvars}

  dense = lambda shape: len(shape) >= 2 and shape[-2:] == (2 * l, 2 * l)
  assert not any(map(dense, shapes(lambda q, k, v: attn.attend(q, k, v, spec, meta, meta))))
  assert any(map(dense, shapes(
      lambda q, k, v: attn.attend(q, k, v, spec, meta, meta, structured=False))))
  monkeypatch.setattr(attn, "STRUCTURED_TWO_STREAM", False)
  assert any(map(dense, shapes(lambda q, k, v: attn.attend(q, k, v, spec, meta, meta))))
  np.testing.assert_array_equal(np.asarray(attn.attend(q, k, v, spec, meta, meta)),
                                np.asarray(reference_attention(q, k, v, spec, meta, meta)))
  # Other kinds, and q/k of different lengths, stay on the dense reference.
  monkeypatch.setattr(attn, "STRUCTURED_TWO_STREAM", True)
  causal = MaskSpec("causal")
  np.testing.assert_array_equal(np.asarray(attn.attend(q, k, v, causal, meta, meta)),
                                np.asarray(reference_attention(q, k, v, causal, meta, meta)))


def test_layout_check():
  spec = MaskSpec("dual_stream", 4)
  meta, _ = two_stream_meta("dual_stream", 8)
  pos, streams, seg = (np.asarray(x) for x in meta)
  assert layout_problems(spec, meta, meta) == []
  q, k, v, _ = qkv(8, 4, 2)

  def problems(p=pos, s=streams, g=seg, kind="dual_stream"):
    m = tuple(jnp.asarray(x) for x in (p, s, g))
    return " ".join(layout_problems(MaskSpec(kind, 4), m, m))

  assert "streams" in problems(kind="bd3lm")  # [clean | noisy] is not bd3lm's order
  assert "streams" in problems(s=streams[:, ::-1])
  gap = pos.copy()
  gap[0, 8 + 5] += 1  # noisy half differs from the clean half
  assert "share positions" in problems(p=gap)
  gap[0, 5] += 1  # both halves, a jump inside segment 1
  assert "increase by 1" in problems(p=gap)
  split = seg.copy()
  split[2, [1, 9]] = 2  # segment 2 appears twice in the half
  assert "contiguous" in problems(g=split)
  bad = tuple(jnp.asarray(x) for x in (pos, streams[:, ::-1], seg))
  with pytest.raises(ValueError, match="layout contract"):
    check_layout(spec, bad, bad)
  with pytest.raises(ValueError, match="layout contract"):  # eager calls check it
    structured_attention(q, k, v, spec, bad, bad)
  with pytest.raises(ValueError, match="chunk=2 must be >= the block size 4"):
    structured_attention(q, k, v, spec, meta, meta, chunk=2)
  with pytest.raises(ValueError, match="even length"):
    structured_attention(q[:, 1:], k[:, 1:], v[:, 1:], spec, meta, meta)


MODEL_CFG = ModelConfig(vocab_size=64, hidden_size=32, intermediate_size=64, num_layers=2,
                        num_heads=4, num_kv_heads=2, mask_token_id=63)


@functools.lru_cache(maxsize=None)
def split_model():
  return nnx.split(create_model(MODEL_CFG, seed=0), nnx.Param)


def sft_batch(l: int = 24):
  """Row 0: prompt 3 + response 13, then padding; row 1: three packed documents of odd
  lengths (prompt + response) and padding; row 2 one document filling the row."""
  return packed_batch([[(3, 13)], [(2, 5), (4, 5), (1, 4)], [(5, l - 5)]], l, seed=0)


@pytest.mark.parametrize("name,block", [("mars", 3), ("bd3lm", 4)])
def test_model_on_objective_inputs(name, block, monkeypatch):
  cfg = base_config().objective
  cfg.name, cfg.block_size = name, block
  objective = make_objective(cfg, MODEL_CFG)
  inputs = objective.corrupt(sft_batch(), jax.random.key(1))
  check_layout(inputs.mask, *[(inputs.positions, inputs.streams, inputs.segment_ids)] * 2)
  graphdef, params = split_model()

  def forward(params):
    logits = nnx.merge(graphdef, params)(inputs.tokens, inputs.positions, inputs.segment_ids,
                                         inputs.mask, inputs.streams)
    return objective.loss(logits, inputs)[0], logits

  calls = []

  def counted(*args, **kwargs):
    calls.append(1)
    return structured_attention(*args, **kwargs)

  monkeypatch.setattr(attn.xla, "structured_attention", counted)  # what "xla" calls

  def run():  # a fresh jit per mode: the switch is read when attend is traced
    calls.clear()
    result = jax.jit(jax.value_and_grad(forward, has_aux=True))(params)
    return result, len(calls)

  ((loss_s, logits_s), grads_s), n_structured = run()
  monkeypatch.setattr(attn, "STRUCTURED_TWO_STREAM", False)
  ((loss_r, logits_r), grads_r), n_dense = run()
  assert n_structured > 0 and n_dense == 0
  real = np.asarray(inputs.segment_ids) > 0  # padding logits are outside the contract
  np.testing.assert_allclose(np.asarray(logits_s)[real], np.asarray(logits_r)[real],
                             atol=TOL, rtol=TOL)
  np.testing.assert_allclose(float(loss_s), float(loss_r), rtol=TOL)
  for gs, gr in zip(jax.tree.leaves(grads_s), jax.tree.leaves(grads_r)):
    np.testing.assert_allclose(np.asarray(gs), np.asarray(gr), atol=TOL, rtol=1e-4)
