"""Structured XLA attention for the two-stream kinds: only the parts that can be visible.

The dense reference scores all (2L)^2 (query, key) pairs of a two-stream row, but half of
the matrix (clean -> noisy) is never visible and the noisy -> noisy quarter is a narrow band
around the diagonal. `structured_attention` computes

  kind         queries  keys                        rule checked per pair
  dual_stream  clean    clean (L)                   causal in position
  (MARS)       noisy    clean (L) | noisy band      earlier block | same block, k_pos <= q_pos
  bd3lm        noisy    noisy band | clean (L)      same block | earlier block
  (BD3LM)      clean    clean (L)                   block-causal

with `spec.allowed` evaluated on the real metadata of every computed pair, the same finite
fill and one float32 softmax per query over everything it may see (for a noisy query: the
concatenation [clean scores | band scores]). Clean -> noisy is never computed. The result
equals `reference_attention` up to float rounding when the inputs follow the layout
contract below: the skipped pairs are exactly those the mask rules can never allow there.

The noisy band: the visible noisy keys of noisy query i lie in (i - B, i] (dual_stream) or
[i - B + 1, i + B - 1] (bd3lm). The noisy half is cut into chunks of c = max(B, CHUNK_MIN)
queries; each chunk is scored against its own key chunk and the one before (dual_stream:
2c keys) or before and after (bd3lm: 3c keys), which covers the band, as dense [c, 2c|3c]
matmuls (no gather); slots outside the half are masked off. Scores per row: 2 L^2 + (2|3)
c L instead of 4 L^2.

A compact MARS row (MaskSpec.noisy_len = N > 0: [clean (L) | the N-token noisy stream of
the blocks that carry loss]) is served the same way with a noisy part of N queries: every
kept block is whole and in order, so a noisy query's visible noisy keys still lie in
(i - B, i] of the noisy part; its contract is the clean stream's below plus, in the noisy
part, each segment one contiguous run whose positions rise by 1 inside each block.

Layout contract (what cardjax.objectives.mars / bd3lm produce; they are the only producers):
  * self-attention: q and k have the same length T = 2L (even), q_meta and k_meta describe
    the same tokens;
  * dual_stream: streams are [0]*L + [1]*L ([clean | noisy]);
    bd3lm:       streams are [1]*L + [0]*L ([noisy | clean]);
  * both halves carry the SAME position ids and the SAME segment ids;
  * every segment id > 0 is one contiguous run of indices inside a half, and its positions
    increase by exactly 1 from one token to the next (packed documents: positions restart
    per document, so a segment, and a block = position // B, need NOT start at an index
    that is a multiple of B).
Under this contract two tokens of one segment in the same block with k_pos <= q_pos lie at
most B-1 indices apart, so the band holds every visible noisy key. Every token sees its own
copy, so no query row is empty and the skipped (masked) pairs weigh exactly 0 in the
reference's softmax too.

Padding (segment 0) is outside the contract: the data pipeline gives padding tokens position
0, so for the reference every padding noisy token sees every padding noisy token, which the
band does not hold. Padding rows' outputs may therefore differ from the reference (they stay
finite). They can never influence a real token (segments differ) and carry no loss, so
losses and gradients of any loss that gives padding zero weight are unchanged.

The contract is checked by `check_layout` (numpy) whenever the metadata is concrete, e.g.
eager calls and tests; under jit it cannot be checked without a host round trip, so it is
documented here and tested in tests/test_attention_structured.py instead.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np

from cardjax.attention.masks import CLEAN, NOISY, MaskSpec

TWO_STREAM_KINDS = ("dual_stream", "bd3lm")
# Smallest query chunk of the noisy band (chunk = max(block_size, CHUNK_MIN)); the band
# costs (2 or 3) * chunk scores per noisy query. On CPU 1..32 time the same.
CHUNK_MIN = 16
_FILL = jnp.finfo(jnp.float32).min  # the reference's finite fill


def _halves(spec: MaskSpec, length: int):
  """(clean slice, noisy slice) of a two-stream row of `length` tokens: 2L aligned halves,
  or L clean + a compact noisy stream of spec.noisy_len."""
  if spec.compact:
    return slice(0, length - spec.noisy_len), slice(length - spec.noisy_len, length)
  l = length // 2
  first, second = slice(0, l), slice(l, 2 * l)
  return (first, second) if spec.kind == "dual_stream" else (second, first)


def _runs_problems(r: int, seg, pos, block: int, where: str) -> list[str]:
  """Each segment one contiguous run whose positions rise by 1 (clean stream), or, in a
  compact noisy stream, by 1 inside each block and upwards from block to block."""
  problems = []
  for sid in np.unique(seg[seg > 0]):
    idx = np.flatnonzero(seg == sid)
    p = pos[idx]
    if idx[-1] - idx[0] + 1 != len(idx):
      problems.append(f"row {r}: segment {sid} of the {where} is not one contiguous run")
    elif block:
      same = (p[1:] // block) == (p[:-1] // block)
      if (np.diff(p)[same] != 1).any() or (np.diff(p)[~same] <= 0).any():
        problems.append(f"row {r}: positions of segment {sid} of the {where} do not rise by "
                        "1 inside each block")
    elif (np.diff(p) != 1).any():
      problems.append(f"row {r}: positions of segment {sid} of the {where} do not increase "
                      "by 1")
  return problems


def layout_problems(spec: MaskSpec, q_meta, k_meta) -> list[str]:
  """What breaks the layout contract (module docstring) in concrete metadata; [] if none."""
  problems = []
  qm = [np.asarray(x) for x in q_meta]
  km = [np.asarray(x) for x in k_meta]
  for name, a, b in zip(("positions", "streams", "segment_ids"), qm, km):
    if a.shape != b.shape or not np.array_equal(a, b):
      problems.append(f"q and k {name} differ (structured attention is self-attention only)")
  pos, streams, seg = qm
  if spec.compact:
    if pos.ndim != 2 or pos.shape[1] <= spec.noisy_len:
      return problems + [f"metadata must be [batch, L + {spec.noisy_len}], got "
                         f"{list(pos.shape)}"]
    clean, noisy = _halves(spec, pos.shape[1])
    if not ((streams[:, clean] == CLEAN).all() and (streams[:, noisy] == NOISY).all()):
      problems.append(f"a compact {spec.kind} needs streams [clean | noisy]")
    for r in range(seg.shape[0]):
      problems += _runs_problems(r, seg[r, clean], pos[r, clean], 0, "clean stream")
      problems += _runs_problems(r, seg[r, noisy], pos[r, noisy], spec.block_size,
                                 "noisy stream")
    return problems
  if pos.ndim != 2 or pos.shape[1] % 2:
    return problems + [f"metadata must be [batch, 2L], got {list(pos.shape)}"]
  l = pos.shape[1] // 2
  clean, noisy = _halves(spec, 2 * l)
  if not ((streams[:, clean] == CLEAN).all() and (streams[:, noisy] == NOISY).all()):
    order = "[clean | noisy]" if spec.kind == "dual_stream" else "[noisy | clean]"
    problems.append(f"{spec.kind} needs streams {order}")
  for name, a in (("positions", pos), ("segment_ids", seg)):
    if not np.array_equal(a[:, :l], a[:, l:]):
      problems.append(f"the two halves must share {name}")
  half_pos, half_seg = pos[:, :l], seg[:, :l]
  for r in range(half_seg.shape[0]):
    s, p = half_seg[r], half_pos[r]
    for sid in np.unique(s[s > 0]):
      idx = np.flatnonzero(s == sid)
      if idx[-1] - idx[0] + 1 != len(idx):
        problems.append(f"row {r}: segment {sid} is not one contiguous run")
      elif (np.diff(p[idx]) != 1).any():
        problems.append(f"row {r}: positions of segment {sid} do not increase by 1")
  return problems


def check_layout(spec: MaskSpec, q_meta, k_meta):
  """Raise ValueError when concrete metadata breaks the layout contract."""
  problems = layout_problems(spec, q_meta, k_meta)
  if problems:
    raise ValueError(f"structured {spec.kind} attention: the inputs break the layout "
                     f"contract (see cardjax/attention/structured.py): {'; '.join(problems)}")


def is_concrete(tree) -> bool:
  """Whether no leaf is a tracer: the layout checks read the metadata only then."""
  return not any(isinstance(x, jax.core.Tracer) for x in jax.tree.leaves(tree))


def _allowed(spec, qm, km):
  """spec.allowed on metadata triples that already broadcast against each other."""
  return spec.allowed(qm[0], km[0], qm[1], km[1], qm[2], km[2])


def _pad_len(x, before: int, after: int):
  pad = [(0, 0)] * x.ndim
  pad[1] = (before, after)
  return jnp.pad(x, pad)


def _query_chunks(x, c: int, n: int):
  """[b, L, ...] -> [b, n, c, ...] (zero padded to n * c)."""
  return _pad_len(x, 0, n * c - x.shape[1]).reshape((x.shape[0], n, c) + x.shape[2:])


def _key_windows(x, c: int, n: int, after: int):
  """[b, L, ...] -> [b, n, (1 + 1 + after) * c, ...]: for query chunk j the key chunks
  j-1, j (and j+1 when after=1), zeros outside [0, L)."""
  xp = _pad_len(x, c, (n + after) * c - x.shape[1])
  xp = xp.reshape((x.shape[0], n + 1 + after, c) + x.shape[2:])
  return jnp.concatenate([xp[:, j:j + n] for j in range(2 + after)], axis=2)


def structured_attention(q, k, v, spec: MaskSpec, q_meta, k_meta, scale: float | None = None,
                         chunk: int | None = None):
  """Attention for the two-stream kinds, equal to `reference_attention` under the layout
  contract of this module. Same arguments and shapes as the reference:
  q [b, 2L, heads, d]; k, v [b, 2L, kv_heads, d]; metas (positions, streams, segment_ids).
  """
  if spec.kind not in TWO_STREAM_KINDS:
    raise ValueError(f"structured attention handles {TWO_STREAM_KINDS}, not {spec.kind!r}")
  b, t, h, d = q.shape
  kvh = k.shape[2]
  if k.shape[1] != t or (t % 2 and not spec.compact) or t <= spec.noisy_len:
    raise ValueError(f"structured {spec.kind} attention needs self-attention over an even "
                     f"length [clean/noisy halves] or [clean | compact noisy "
                     f"({spec.noisy_len})]; got q length {t}, k length {k.shape[1]}")
  if h % kvh:
    raise ValueError(f"{h} query heads are not a multiple of {kvh} kv heads")
  if is_concrete((q_meta, k_meta)):
    check_layout(spec, q_meta, k_meta)
  scale = d ** -0.5 if scale is None else scale
  g = h // kvh
  clean, noisy = _halves(spec, t)
  lc, l = clean.stop - clean.start, noisy.stop - noisy.start  # clean and noisy lengths
  qm_c = tuple(x[:, clean] for x in q_meta)
  qm_n = tuple(x[:, noisy] for x in q_meta)
  km_c = tuple(x[:, clean] for x in k_meta)
  km_n = tuple(x[:, noisy] for x in k_meta)
  kc, vc, kn, vn = k[:, clean], v[:, clean], k[:, noisy], v[:, noisy]

  # Clean queries see clean keys only: an L x L block, rule checked per pair.
  qg_c = q[:, clean].reshape(b, lc, kvh, g, d)
  s = jnp.einsum("bqkgd,bskd->bkgqs", qg_c, kc, preferred_element_type=jnp.float32) * scale
  mask = _allowed(spec, tuple(x[:, :, None] for x in qm_c), tuple(x[:, None, :] for x in km_c))
  s = jnp.where(mask[:, None, None], s, _FILL)
  p = jax.nn.softmax(s, axis=-1).astype(v.dtype)
  out_c = jnp.einsum("bkgqs,bskd->bqkgd", p, vc).reshape(b, lc, h, d)

  # Noisy queries: L clean keys plus the band of noisy keys, one joint softmax.
  qg_n = q[:, noisy].reshape(b, l, kvh, g, d)
  s_c = jnp.einsum("bqkgd,bskd->bkgqs", qg_n, kc, preferred_element_type=jnp.float32) * scale
  mask_c = _allowed(spec, tuple(x[:, :, None] for x in qm_n), tuple(x[:, None, :] for x in km_c))
  s_c = jnp.where(mask_c[:, None, None], s_c, _FILL)

  # The noisy band, computed per chunk of c >= B queries against the key chunks around it
  # (dual_stream: the chunk before and its own, holding (i - B, i]; bd3lm: also the chunk
  # after, holding [i - B + 1, i + B - 1]): dense [c, w] matmuls, no gather.
  c = max(spec.block_size, CHUNK_MIN) if chunk is None else chunk
  if c < spec.block_size:
    raise ValueError(f"chunk={c} must be >= the block size {spec.block_size}")
  n = -(-l // c)
  after = 0 if spec.kind == "dual_stream" else 1
  w = (2 + after) * c
  kb, vb = _key_windows(kn, c, n, after), _key_windows(vn, c, n, after)  # [b, n, w, kvh, d]
  km_b = tuple(_key_windows(x, c, n, after)[:, :, None, :] for x in km_n)  # [b, n, 1, w]
  qm_b = tuple(_query_chunks(x, c, n)[:, :, :, None] for x in qm_n)  # [b, n, c, 1]
  k_idx = (jnp.arange(n) * c - c)[:, None, None] + jnp.arange(w)  # [n, 1, w]
  mask_b = (k_idx >= 0) & (k_idx < l) & _allowed(spec, qm_b, km_b)  # [b, n, c, w]
  s_b = jnp.einsum("bnqkgd,bnskd->bkgnqs", _query_chunks(qg_n, c, n), kb,
                   preferred_element_type=jnp.float32) * scale
  s_b = jnp.where(mask_b[:, None, None], s_b, _FILL).reshape(b, kvh, g, n * c, w)[..., :l, :]

  p = jax.nn.softmax(jnp.concatenate([s_c, s_b], axis=-1), axis=-1).astype(v.dtype)
  p_c = p[..., :lc]
  p_b = _pad_len(jnp.moveaxis(p[..., lc:], 3, 1), 0, n * c - l)  # [b, n*c, kvh, g, w]
  p_b = p_b.reshape(b, n, c, kvh, g, w)
  f32 = jnp.float32  # sum the two parts before rounding to the compute dtype
  out_b = jnp.einsum("bnqkgs,bnskd->bnqkgd", p_b, vb, preferred_element_type=f32)
  out_n = (jnp.einsum("bkgqs,bskd->bqkgd", p_c, vc, preferred_element_type=f32)
           + out_b.reshape(b, n * c, kvh, g, d)[:, :l])
  out_n = out_n.astype(out_c.dtype).reshape(b, l, h, d)

  parts = (out_c, out_n) if spec.kind == "dual_stream" else (out_n, out_c)
  return jnp.concatenate(parts, axis=1)
