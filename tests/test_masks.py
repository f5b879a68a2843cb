"""Attention mask specs against METHODS.md's rules, written out as plain Python loops, and
the dense reference attention against a numpy softmax."""

from __future__ import annotations


import jax.numpy as jnp
import numpy as np
import pytest

from cardjax.attention import (BIDIRECTIONAL, CAUSAL, CLEAN, NOISY, MaskSpec, cache_attention,
                               dense_mask, reference_attention)
from cardjax.attention.masks import KINDS
from cardjax.model import ModelConfig, create_model
from conftest import cardjax_logits, max_abs_diff


def rule(kind: str, block: int, q, k) -> bool:
  """METHODS.md, one (query, key) pair at a time. q and k are (position, stream, segment);
  the block of a token is beta(i) = i // B of its POSITION (streams share positions)."""
  (i, q_stream, q_seg), (j, k_stream, k_seg) = q, k
  if q_seg != k_seg:  # packed documents never see each other
    return False
  if kind == "causal":
    return j <= i
  if kind == "bidirectional":
    return True
  beta_i, beta_j = i // block, j // block
  if kind == "block_causal":
    return beta_j <= beta_i
  clean_q, clean_k = q_stream == CLEAN, k_stream == CLEAN
  if kind == "dual_stream":  # MARS
    if clean_q and clean_k:
      return j <= i  # clean -> clean: causal
    if not clean_q and not clean_k:
      return beta_j == beta_i and j <= i  # noisy -> noisy: causal inside the block
    if not clean_q and clean_k:
      return beta_j < beta_i  # noisy -> clean: earlier blocks only
    return False  # clean -> noisy: never
  if kind == "bd3lm":
    if not clean_q and not clean_k:
      return beta_j == beta_i  # noisy -> noisy: the whole block
    if not clean_q and clean_k:
      return beta_j < beta_i  # noisy -> clean: earlier blocks
    if clean_q and clean_k:
      return beta_j <= beta_i  # clean -> clean: block-causal
    return False  # clean -> noisy: never
  raise AssertionError(kind)


def loop_mask(kind, block, q_meta, k_meta) -> np.ndarray:
  """[batch, q_len, k_len] by a double loop over plain Python ints."""
  qp, qs, qg = (np.asarray(a).tolist() for a in q_meta)
  kp, ks, kg = (np.asarray(a).tolist() for a in k_meta)
  out = np.zeros((len(qp), len(qp[0]), len(kp[0])), bool)
  for b in range(len(qp)):
    for x in range(len(qp[b])):
      for y in range(len(kp[b])):
        out[b, x, y] = rule(kind, block, (qp[b][x], qs[b][x], qg[b][x]),
                            (kp[b][y], ks[b][y], kg[b][y]))
  return out


def spec_of(kind, block):
  return MaskSpec(kind, block if kind in ("dual_stream", "bd3lm", "block_causal") else 0)


def dual_stream_meta(doc_lengths, noisy_first=False):
  """One row [clean stream | noisy stream], each stream the packed documents with positions
  restarting at 0 per document; the noisy stream repeats the clean positions and segments."""
  pos = np.concatenate([np.arange(n) for n in doc_lengths])
  seg = np.concatenate([np.full(n, s + 1) for s, n in enumerate(doc_lengths)])
  streams = [np.full(len(pos), CLEAN), np.full(len(pos), NOISY)]
  if noisy_first:
    streams = streams[::-1]
  meta = (np.concatenate([pos, pos]), np.concatenate(streams), np.concatenate([seg, seg]))
  return tuple(jnp.asarray(a[None], jnp.int32) for a in meta)


def check(spec, q_meta, k_meta=None):
  k_meta = q_meta if k_meta is None else k_meta
  got = np.asarray(dense_mask(spec, q_meta, k_meta))
  want = loop_mask(spec.kind, spec.block_size, q_meta, k_meta)
  assert got.dtype == bool and got.shape == want.shape
  bad = np.argwhere(got != want)
  assert not len(bad), f"{spec}: {len(bad)} entries differ, first (b, q, k) {bad[:5].tolist()}"
  return got


# --- hand-written anchors (L = 4, B = 2), so the loop itself is checked too -----------------
# Rows are queries, columns keys, both laid out [clean 0..3 | noisy 0..3].

DUAL_4_2 = """
1000 0000
1100 0000
1110 0000
1111 0000
0000 1000
0000 1100
1100 0010
1100 0011
"""
BD3LM_4_2 = """
1100 0000
1100 0000
1111 0000
1111 0000
0000 1100
0000 1100
1100 0011
1100 0011
"""


def _parse(text):
  rows = [line.replace(" ", "") for line in text.strip().splitlines()]
  return np.array([[c == "1" for c in row] for row in rows])


@pytest.mark.parametrize("kind,text", [("dual_stream", DUAL_4_2), ("bd3lm", BD3LM_4_2)])
def test_hand_written_dual_stream_masks(kind, text):
  meta = dual_stream_meta([4])
  got = check(MaskSpec(kind, 2), meta)[0]
  np.testing.assert_array_equal(got, _parse(text))


def test_hand_written_single_stream_masks():
  meta = tuple(jnp.asarray(a[None], jnp.int32) for a in
               (np.arange(6), np.zeros(6), np.array([1, 1, 1, 1, 2, 2])))
  causal = np.asarray(dense_mask(CAUSAL, meta, meta))[0]
  np.testing.assert_array_equal(causal, np.tril(np.ones((6, 6), bool)) & np.array(
      [[a == b for b in [1, 1, 1, 1, 2, 2]] for a in [1, 1, 1, 1, 2, 2]]))
  bidi = np.asarray(dense_mask(BIDIRECTIONAL, meta, meta))[0]
  assert bidi[:4, :4].all() and bidi[4:, 4:].all() and not bidi[:4, 4:].any()
  assert not bidi[4:, :4].any()
  # Positions 0..5, B = 4: block 0 = {0..3}, block 1 = {4, 5} (a partial block).
  blk = np.asarray(dense_mask(MaskSpec("block_causal", 4), meta[:2] + (jnp.ones((1, 6),
                                                                              jnp.int32),),
                              meta[:2] + (jnp.ones((1, 6), jnp.int32),)))[0]
  expected = np.array([[j // 4 <= i // 4 for j in range(6)] for i in range(6)])
  np.testing.assert_array_equal(blk, expected)


# --- every kind against the loop ---------------------------------------------------------

@pytest.mark.parametrize("kind", KINDS)
@pytest.mark.parametrize("block", [1, 2, 3, 4])
@pytest.mark.parametrize("noisy_first", [False, True], ids=["clean|noisy", "noisy|clean"])
def test_dual_stream_layout(kind, block, noisy_first):
  """[clean 0..L-1 | noisy 0..L-1], L = 10 (B = 3, 4 leave a partial last block)."""
  check(spec_of(kind, block), dual_stream_meta([10], noisy_first))


@pytest.mark.parametrize("kind", KINDS)
@pytest.mark.parametrize("block", [2, 3])
def test_dual_stream_packed_documents(kind, block):
  """Two documents (lengths 5 and 7) in each stream: no attention across documents, and the
  second document's blocks restart at its position 0."""
  meta = dual_stream_meta([5, 7])
  got = check(spec_of(kind, block), meta)[0]
  seg = np.asarray(meta[2])[0]
  assert not got[seg[:, None] != seg[None, :]].any()
  assert got.any(axis=1).all()  # every token sees at least itself or a clean prefix


@pytest.mark.parametrize("kind", KINDS)
@pytest.mark.parametrize("block", [1, 2, 3, 5])
def test_random_metadata(kind, block):
  """Random positions, streams and segments, and different query and key sets (a decode
  step against a cache): the predicate is a pure function of the metadata."""
  rng = np.random.default_rng(block * 10 + KINDS.index(kind))
  def meta(n):
    return (jnp.asarray(rng.integers(0, 12, (3, n)), jnp.int32),
            jnp.asarray(rng.integers(0, 2, (3, n)), jnp.int32),
            jnp.asarray(rng.integers(1, 3, (3, n)), jnp.int32))
  q_meta, k_meta = meta(9), meta(13)
  got = check(spec_of(kind, block), q_meta, k_meta)
  assert got.any() and not got.all()
  # numpy metadata gives the same answer (the kernels' per-tile and the tests' path).
  np_q = tuple(np.asarray(a) for a in q_meta)
  np_k = tuple(np.asarray(a) for a in k_meta)
  np.testing.assert_array_equal(np.asarray(dense_mask(spec_of(kind, block), np_q, np_k)), got)


@pytest.mark.parametrize("kind", KINDS)
def test_is_causal_in_position(kind):
  """The flag promises no visible key lies at a later position than its query."""
  spec = spec_of(kind, 3)
  meta = dual_stream_meta([7, 5])
  got = np.asarray(dense_mask(spec, meta, meta))[0]
  pos = np.asarray(meta[0])[0]
  sees_future = bool((got & (pos[None, :] > pos[:, None])).any())
  assert spec.is_causal_in_position == (not sees_future)


def test_mask_spec_validation():
  with pytest.raises(ValueError, match="unknown attention mask kind"):
    MaskSpec("sliding")
  for kind in ("dual_stream", "bd3lm", "block_causal"):
    with pytest.raises(ValueError, match="block_size"):
      MaskSpec(kind)
    with pytest.raises(ValueError, match="block_size"):
      MaskSpec(kind, -2)
  assert CAUSAL == MaskSpec("causal") and hash(MaskSpec("bd3lm", 4)) == hash(MaskSpec("bd3lm", 4))


# --- reference attention against numpy -------------------------------------------------

def numpy_attention(q, k, v, mask, scale):
  """Plain softmax attention; query head h uses kv head h // (heads / kv_heads)."""
  b, tq, h, d = q.shape
  kvh = k.shape[2]
  out = np.zeros((b, tq, h, d))
  for bi in range(b):
    for hi in range(h):
      kh = hi // (h // kvh)
      s = (q[bi, :, hi].astype(np.float64) @ k[bi, :, kh].T.astype(np.float64)) * scale
      s = np.where(mask[bi], s, -np.inf)
      with np.errstate(invalid="ignore"):
        p = np.exp(s - s.max(axis=-1, keepdims=True))
        p = p / p.sum(axis=-1, keepdims=True)
      out[bi, :, hi] = p @ v[bi, :, kh].astype(np.float64)
  return out


def cache_layout_attention(q, k, v, spec, q_meta, k_meta, scale=None):
  """cache_attention on k, v moved into the KV cache's [batch, kv_heads, slots, dim]."""
  return cache_attention(q, jnp.swapaxes(k, 1, 2), jnp.swapaxes(v, 1, 2), spec, q_meta,
                         k_meta, scale=scale)


@pytest.mark.parametrize("attention", [reference_attention, cache_layout_attention],
                         ids=["reference", "cache_layout"])
@pytest.mark.parametrize("spec", [CAUSAL, MaskSpec("dual_stream", 2), MaskSpec("bd3lm", 3)],
                         ids=lambda s: s.kind)
@pytest.mark.parametrize("scale", [None, 0.3])
def test_reference_attention_matches_numpy(spec, scale, attention):
  rng = np.random.default_rng(0)
  b, tq, tk, h, kvh, d = 2, 7, 9, 4, 2, 8
  q = rng.normal(size=(b, tq, h, d)).astype(np.float32)
  k = rng.normal(size=(b, tk, kvh, d)).astype(np.float32)
  v = rng.normal(size=(b, tk, kvh, d)).astype(np.float32)
  k_meta = (rng.integers(0, 6, (b, tk)), rng.integers(0, 2, (b, tk)), rng.integers(1, 3, (b, tk)))
  q_meta = (rng.integers(0, 6, (b, tq)), rng.integers(0, 2, (b, tq)), rng.integers(1, 3, (b, tq)))
  # Query row (1, 4) is padding: segment 0, which no key has, so it sees nothing.
  q_meta[2][1, 4] = 0
  q_meta = tuple(jnp.asarray(a, jnp.int32) for a in q_meta)
  k_meta = tuple(jnp.asarray(a, jnp.int32) for a in k_meta)

  mask = loop_mask(spec.kind, spec.block_size, q_meta, k_meta)
  assert not mask[1, 4].any()
  out = np.asarray(attention(jnp.asarray(q), jnp.asarray(k), jnp.asarray(v), spec, q_meta,
                             k_meta, scale=scale))
  assert out.shape == (b, tq, h, d) and out.dtype == np.float32
  assert np.all(np.isfinite(out)), "a query that sees nothing must not produce NaN/inf"
  want = numpy_attention(q, k, v, mask, d ** -0.5 if scale is None else scale)
  rows = mask.any(axis=-1)  # [b, tq]: rows with at least one visible key
  assert rows.sum() >= 8
  np.testing.assert_allclose(out[rows], want[rows], atol=1e-5, rtol=1e-5)


@pytest.mark.parametrize("attention", [reference_attention, cache_layout_attention],
                         ids=["reference", "cache_layout"])
def test_reference_attention_gqa_grouping(attention):
  """Query heads 0-1 read kv head 0 and heads 2-3 read kv head 1 (HF's repeat_interleave)."""
  b, t, d = 1, 3, 4
  q = jnp.ones((b, t, 4, d))
  k = jnp.zeros((b, t, 2, d))
  v = jnp.stack([jnp.full((b, t, d), 1.0), jnp.full((b, t, d), 2.0)], axis=2)
  meta = (jnp.arange(t)[None], jnp.zeros((1, t), jnp.int32), jnp.ones((1, t), jnp.int32))
  out = np.asarray(attention(q, k, v, CAUSAL, meta, meta))
  np.testing.assert_array_equal(out[0, :, :2], 1.0)
  np.testing.assert_array_equal(out[0, :, 2:], 2.0)


@pytest.mark.parametrize("attention", [reference_attention, cache_layout_attention],
                         ids=["reference", "cache_layout"])
def test_reference_attention_rejects_bad_grouping(attention):
  q = jnp.zeros((1, 2, 3, 4))
  k = jnp.zeros((1, 2, 2, 4))
  meta = (jnp.zeros((1, 2), jnp.int32),) * 3
  with pytest.raises(ValueError, match="3 query heads"):
    attention(q, k, k, CAUSAL, meta, meta)


# --- the masks inside the decoder --------------------------------------------------------

@pytest.fixture(scope="module")
def decoder():
  cfg = ModelConfig(vocab_size=64, hidden_size=32, intermediate_size=64, num_heads=4,
                    num_kv_heads=2, initializer_range=0.3)
  return create_model(cfg, seed=1)


L, B = 8, 4


def _dual_inputs(noisy_first=False):
  """The objectives' layouts: MARS [clean | noisy], BD3LM [noisy | clean]."""
  rng = np.random.default_rng(4)
  clean = rng.integers(0, 63, (1, L))
  noisy = clean.copy()
  noisy[:, 2:] = 63  # prompt of 2 tokens, response masked
  halves = [noisy, clean] if noisy_first else [clean, noisy]
  tokens = jnp.asarray(np.concatenate(halves, axis=1), jnp.int32)
  pos = jnp.asarray(np.tile(np.arange(L), 2)[None], jnp.int32)
  order = [NOISY, CLEAN] if noisy_first else [CLEAN, NOISY]
  streams = jnp.asarray(np.repeat(order, L)[None], jnp.int32)
  return clean, noisy, tokens, pos, streams


@pytest.mark.parametrize("kind,clean_kind", [("dual_stream", CAUSAL),
                                             ("bd3lm", MaskSpec("block_causal", B))])
def test_decoder_dual_stream_equals_single_stream_runs(decoder, kind, clean_kind):
  """Since clean never sees noisy, the clean half equals a single-stream run of the clean
  tokens alone; noisy block beta equals a single-stream run of [clean blocks < beta | noisy
  block beta] (causal for MARS, block-causal for bd3lm)."""
  noisy_first = kind == "bd3lm"
  clean, noisy, tokens, pos, streams = _dual_inputs(noisy_first)
  c0, n0 = (L, 0) if noisy_first else (0, L)  # where the clean / noisy halves start
  out = cardjax_logits(decoder, tokens, positions=pos, streams=streams, mask=MaskSpec(kind, B),
                       jit=True)
  alone = cardjax_logits(decoder, clean, mask=clean_kind, jit=True)
  assert np.std(alone) > 0.05
  assert max_abs_diff(out[:, c0:c0 + L], alone) < 1e-5
  for beta in range(L // B):
    seq = np.concatenate([clean[:, :beta * B], noisy[:, beta * B:(beta + 1) * B]], axis=1)
    single = cardjax_logits(decoder, seq, mask=clean_kind, jit=True)
    got = out[:, n0 + beta * B:n0 + (beta + 1) * B]
    assert max_abs_diff(got, single[:, beta * B:]) < 1e-5, beta
  # And the noisy stream is not just the clean one (the test would be vacuous).
  assert max_abs_diff(out[:, n0 + B:n0 + L], out[:, c0 + B:c0 + L]) > 1e-3
