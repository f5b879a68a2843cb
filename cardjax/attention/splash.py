"""Splash attention (the TPU Pallas kernel) for every MaskSpec kind.

`splash_attention` runs `jax.experimental.pallas.ops.tpu.splash_attention` with a mask the
kernel computes from tile indices: `SpecMask.mask_function` evaluates `MaskSpec.allowed` on
(position, stream) derived from the query and key INDICES, so no [T, T] mask is ever
stored, and splash skips the tiles the predicate leaves empty (found on the host, numpy, by
the same function). Packed documents and padding go through splash's `SegmentIds` (per row,
per element). Same arguments and result as `reference_attention`:
q [b, T, heads, d]; k, v [b, T, kv_heads, d]; metas (positions, streams, segment_ids).

Layout contract (the kernel sees indices, not the metadata, so the metadata must be
derivable from them):
  * self-attention: q and k have the same length T and the same metadata;
  * index-derived position and stream: single-stream kinds (causal, bidirectional,
    block_causal): position = index, stream = clean. Two-stream kinds over T = 2L:
    dual_stream [clean | noisy], bd3lm [noisy | clean]; position = index within its half;
    both halves carry the same positions and segment ids (what cardjax.objectives.mars and
    bd3lm produce; the checks of cardjax/attention/structured.py apply);
  * every segment id > 0 (per half) has position - index constant (positions increase by
    1 along the segment), so "k_pos <= q_pos" equals "k_idx <= q_idx" inside a segment;
  * block kinds (dual_stream, bd3lm, block_causal): additionally (index within the half -
    position) is a multiple of B for every token of a segment: with positions starting at
    0 per document, every segment starts at an index that is a multiple of B in its half.
    The SFT pipeline guarantees it (conversations are EOS-padded to a multiple of the MARS
    block size, cardjax/data/pipeline.py); pretraining's arbitrary-length packing does NOT,
    so MARS/BD3LM on packed pretraining rows needs attention_impl=xla.
  * the compact MARS noisy stream (MaskSpec.noisy_len = N > 0, T = L + N: [clean (L) |
    the whole blocks that carry loss, then filler]): the clean stream [0, L) follows the
    contract above, every noisy token of a segment > 0 has a clean token of the same
    segment and position, and the kept blocks are whole (what cardjax.objectives.mars
    produces). Which blocks a row keeps is data, which a static index mask cannot say,
    so cardjax/attention/splash_compact.py scatters the compact noisy q, k, v into an
    aligned [clean | noisy (L)] row, runs the static dual_stream mask on it and gathers
    the kept tokens' outputs back: exact, but attention costs the full 2L row (the full
    copy's attention, never more); only the MLP and projections keep the compact saving.
    The other exact route, splash's dynamic mask (a jax.Array mask, which splash
    materialises whole, [T, T] per row and head group: the memory the kernel exists to
    avoid), is not taken.
Under the contract the index-derived mask equals `spec.allowed` on the real metadata for
every pair of the same segment, and splash's segment mask does the rest. `check_layout`
verifies it whenever the metadata is concrete (eager calls, tests); under jit it cannot be
checked without a host round trip, so it is documented here and tested in
tests/test_attention_splash.py (compact rows: tests/test_attention_splash_compact.py).

Padding (segment 0) rows, compact filler included: their output is set to 0 (the
reference gives them an average of other padding tokens; no loss reads them). Real tokens
never see padding, so losses and gradients of any loss that gives padding zero weight
equal the reference's.

Lengths: splash tiles are multiples of 128, so T is padded up to a multiple of 128 with
slots of their own segment (-1: they see only each other and are cut off afterwards).

GQA: the MQA kernel per kv head (vmap over kv heads), each serving its group of
heads // kv_heads query heads. Repeating k and v to full MHA would store and read the group
size times more keys and values and sum their gradients back; the MQA kernel reads one k/v
tile for the whole group and accumulates dk, dv over the group itself.

Batch: vmap over rows (the per-row segment ids are kernel operands). Under a mesh
(jax.set_mesh) the call runs inside `jax.shard_map`: batch over the mesh axes the
'act_batch' rule names, heads over the 'act_heads' axes when both the query and the kv heads
divide over them (else heads stay whole on every device); a Pallas call is a custom call
XLA's partitioner cannot split, so without shard_map it would gather the whole batch.

interpret: run the kernel in Pallas interpret mode (any backend, slow; tests on CPU). It is
passed to the kernel, not set globally: `pltpu.force_tpu_interpret_mode()` fails under vmap
on jax 0.10.2 and 0.11.
"""

from __future__ import annotations

import functools

import jax
import jax.numpy as jnp
import numpy as np
from jax.experimental.pallas.ops.tpu.splash_attention import splash_attention_kernel as sk
from jax.experimental.pallas.ops.tpu.splash_attention import splash_attention_mask as sm
from jax.sharding import PartitionSpec as P

from cardjax.attention import splash_compact
from cardjax.attention.masks import CLEAN, NOISY, MaskSpec
from cardjax.attention.structured import TWO_STREAM_KINDS, is_concrete
from cardjax.attention.structured import layout_problems as stream_problems

BLOCK_KINDS = ("dual_stream", "bd3lm", "block_causal")
LANES = 128  # splash tiles are multiples of the TPU lane width
# Preferred tile edge: splash's fwd and bwd tiles are min(this, T) rounded to a divisor of
# the (128-padded) length; 512 keeps the MXU busy with few grid steps on v5p.
DEFAULT_BLOCK = 512
_PAD_SEGMENT = -1  # segment id of the length padding (real ids are >= 0)


def _index_meta(spec: MaskSpec, half: int, ids):
  """(position, stream) of token indices (numpy or jnp), per the layout contract."""
  xp = np if isinstance(ids, np.ndarray) else jnp
  zero = ids * 0
  if spec.kind not in TWO_STREAM_KINDS:
    return ids, zero + CLEAN
  first = ids < half
  pos = xp.where(first, ids, ids - half)
  a, b = (CLEAN, NOISY) if spec.kind == "dual_stream" else (NOISY, CLEAN)
  return pos, xp.where(first, zero + a, zero + b)


class SpecMask(sm._ComputableMask):
  """A splash mask computed from a MaskSpec on index-derived metadata.

  shape: the padded (T, T); half: L for the two-stream kinds (indices >= L are the second
  half), unused otherwise. The same predicate serves splash's host-side tile scan (numpy)
  and the kernel's per-tile mask (jnp)."""

  def __init__(self, spec: MaskSpec, shape: tuple[int, int], half: int = 0):
    self.spec, self.half = spec, half

    def mask_function(q_ids, kv_ids):
      qp, qs = _index_meta(spec, half, q_ids)
      kp, ks = _index_meta(spec, half, kv_ids)
      # Segments are splash's SegmentIds; equal zeros here keep the result a full array.
      return spec.allowed(qp, kp, qs, ks, q_ids * 0, kv_ids * 0)

    super().__init__(shape=shape, mask_function=mask_function)

  def __eq__(self, other):
    if not isinstance(other, SpecMask):
      return NotImplemented
    return (self.spec, self.half, self.shape) == (other.spec, other.half, other.shape)

  def __hash__(self):
    return hash((SpecMask, self.spec, self.half, self.shape))


def layout_problems(spec: MaskSpec, q_meta, k_meta) -> list[str]:
  """What breaks the layout contract (module docstring) in concrete metadata; [] if none."""
  qm = [np.asarray(x) for x in q_meta]
  km = [np.asarray(x) for x in k_meta]
  if spec.kind in TWO_STREAM_KINDS:
    problems = stream_problems(spec, qm, km)
    if problems:
      return problems
    # The clean stream is the first half, or the first L = T - N tokens of a compact row.
    l = qm[0].shape[1] - spec.noisy_len if spec.compact else qm[0].shape[1] // 2
    pos, seg = qm[0][:, :l], qm[2][:, :l]
  else:
    problems = []
    for name, a, b in zip(("positions", "streams", "segment_ids"), qm, km):
      if a.shape != b.shape or not np.array_equal(a, b):
        problems.append(f"q and k {name} differ (splash serves self-attention only)")
    if problems:
      return problems
    pos, seg = qm[0], qm[2]
  if spec.kind == "bidirectional":
    return []
  if spec.compact:
    problems += splash_compact.layout_problems(spec, qm)
  idx = np.arange(pos.shape[1])
  offset = pos - idx  # constant along a segment under the contract
  for r in range(seg.shape[0]):
    for sid in np.unique(seg[r][seg[r] > 0]):
      off = offset[r][seg[r] == sid]
      if (off != off[0]).any():
        problems.append(f"row {r}: positions of segment {sid} do not increase by 1 with the "
                        "index")
      elif spec.kind in BLOCK_KINDS and off[0] % spec.block_size:
        start = int(np.flatnonzero(seg[r] == sid)[0])
        problems.append(f"row {r}: segment {sid} starts at index {start} (position "
                        f"{pos[r][start]}), not on a block boundary of B={spec.block_size}")
  return problems


def check_layout(spec: MaskSpec, q_meta, k_meta):
  """Raise ValueError when concrete metadata breaks the layout contract."""
  problems = layout_problems(spec, q_meta, k_meta)
  if problems:
    raise ValueError(
        f"splash {spec.kind} attention: the inputs break its layout contract (see "
        f"cardjax/attention/splash.py): {'; '.join(problems[:4])}. Pad documents to a "
        "multiple of the block size (the SFT pipeline does) or use attention_impl=xla")


def _tile(length: int, want: int) -> int:
  """The largest multiple of 128 that divides `length` (a multiple of 128) and is <= want."""
  t = max(LANES, min(want, length) // LANES * LANES)
  while length % t:
    t -= LANES
  return t


def block_sizes(length: int, block_q: int = DEFAULT_BLOCK, block_kv: int = DEFAULT_BLOCK):
  """Forward, dq and dkv tiles for a (128-padded) length."""
  bq, bkv = _tile(length, block_q), _tile(length, block_kv)
  return sk.BlockSizes(block_q=bq, block_kv=bkv, block_kv_compute=bkv,
                       block_q_dkv=bq, block_kv_dkv=bkv, block_kv_dkv_compute=bkv,
                       block_q_dq=bq, block_kv_dq=bkv)


def unsupported_reason(spec: MaskSpec, q_len: int, k_len: int, head_dim: int) -> str | None:
  """Why splash cannot serve these shapes (None when it can)."""
  if q_len != k_len:
    return (f"splash serves self-attention (q length == k length); got {q_len} queries "
            f"over {k_len} keys")
  if spec.compact and spec.noisy_len > q_len - spec.noisy_len:
    # Its tokens are whole blocks of the clean stream, scattered into an aligned copy of it.
    return (f"a compact noisy stream of {spec.noisy_len} tokens holds blocks of the clean "
            f"stream, so it cannot be longer than the clean stream ({q_len - spec.noisy_len} "
            "tokens)")
  if spec.kind in TWO_STREAM_KINDS and not spec.compact and q_len % 2:
    return f"{spec.kind} needs an even row of two halves; got length {q_len}"
  del head_dim  # splash's q/k/v tiles span the whole head_dim: any size lowers
  return None


def _local(q, k, v, seg, *, spec: MaskSpec, half: int, interpret: bool, blocks, scale):
  """Splash on this device's rows and heads: q [b, T, h, d], k, v [b, T, kvh, d]."""
  b, t, h, d = q.shape
  kvh = k.shape[2]
  g = h // kvh
  tp = -(-t // LANES) * LANES
  pad = ((0, 0), (0, tp - t), (0, 0), (0, 0))
  q, k, v = (jnp.pad(x, pad) for x in (q, k, v))
  seg = jnp.pad(seg, ((0, 0), (0, tp - t)), constant_values=_PAD_SEGMENT)
  mask = sm.MultiHeadMask([SpecMask(spec, (tp, tp), half)] * g)
  sizes = blocks or block_sizes(tp)
  kernel = sk.make_splash_mqa_single_device(mask, block_sizes=sizes, interpret=interpret)
  # splash does not scale the scores: fold the softmax scale into q.
  qg = (q * jnp.asarray(scale, q.dtype)).reshape(b, tp, kvh, g, d).transpose(0, 2, 3, 1, 4)
  kt, vt = k.transpose(0, 2, 1, 3), v.transpose(0, 2, 1, 3)  # [b, kvh, tp, d]

  def row(qr, kr, vr, sr):  # one row: qr [kvh, g, tp, d], kr [kvh, tp, d], sr [tp]
    ids = sk.SegmentIds(q=sr, kv=sr)
    return jax.vmap(lambda qh, kh, vh: kernel(qh, kh, vh, segment_ids=ids))(qr, kr, vr)

  out = jax.vmap(row)(qg, kt, vt, seg)  # [b, kvh, g, tp, d]
  out = out.transpose(0, 3, 1, 2, 4).reshape(b, tp, h, d)[:, :t]
  # Padding rows (segment 0) give 0: defined, finite, and never read by a loss.
  return jnp.where((seg[:, :t] > 0)[:, :, None, None], out, 0).astype(q.dtype)


def _mesh_specs(mesh, b: int, h: int, kvh: int):
  """(batch axes, heads axes) for shard_map: the rules' act_batch / act_heads axes that
  divide the batch and both head counts."""
  from cardjax.parallel.sharding import logical_to_spec

  shape = {a: n for a, n in mesh.shape.items() if a not in mesh.manual_axes}
  batch = logical_to_spec(("act_batch",), (b,), shape)[0]
  heads = logical_to_spec(("act_heads",), (h,), shape)[0]
  kv_heads = logical_to_spec(("act_kv_heads",), (kvh,), shape)[0]
  return batch, heads if heads == kv_heads else None


def splash_attention(q, k, v, spec: MaskSpec, q_meta, k_meta, *, interpret: bool = False,
                     block_q: int | None = None, block_kv: int | None = None,
                     scale: float | None = None):
  """Attention by the splash kernel, equal to `reference_attention` on real tokens under
  the layout contract of this module (padding rows give 0). block_q / block_kv: tile edges
  (multiples of 128; default min(512, T) rounded to a divisor of the padded length)."""
  _, t, h, d = q.shape
  kvh = k.shape[2]
  if h % kvh:
    raise ValueError(f"{h} query heads are not a multiple of {kvh} kv heads")
  reason = unsupported_reason(spec, t, k.shape[1], d)
  if reason:
    raise ValueError(f"splash attention cannot serve this call: {reason}; use "
                     "attention_impl=xla")
  if is_concrete((q_meta, k_meta)):
    check_layout(spec, q_meta, k_meta)
  for name, blk in (("block_q", block_q), ("block_kv", block_kv)):
    if blk is not None and (blk < LANES or blk % LANES):
      raise ValueError(f"splash {name}={blk} must be a positive multiple of {LANES}")
  # A compact row runs as its aligned [clean | noisy (L)] row (splash_compact.py).
  run_t = 2 * (t - spec.noisy_len) if spec.compact else t
  blocks = None
  if block_q or block_kv:
    blocks = block_sizes(-(-run_t // LANES) * LANES, block_q or DEFAULT_BLOCK,
                         block_kv or DEFAULT_BLOCK)
  run_spec = MaskSpec(spec.kind, spec.block_size)  # the static mask of the (aligned) row
  half = run_t // 2 if spec.kind in TWO_STREAM_KINDS else run_t
  local = functools.partial(_local, spec=run_spec, half=half, interpret=interpret,
                            blocks=blocks, scale=d ** -0.5 if scale is None else scale)
  attend = functools.partial(_sharded, local=local, h=h, kvh=kvh)
  if spec.compact:
    return splash_compact.compact_attention(attend, q, k, v, spec, q_meta)
  return attend(q, k, v, jnp.asarray(q_meta[2], jnp.int32))


def _sharded(q, k, v, seg, *, local, h: int, kvh: int):
  """`local` on the whole batch, inside shard_map under a mesh (module docstring)."""
  mesh = jax.sharding.get_abstract_mesh()
  if mesh.empty or set(mesh.axis_names) <= set(mesh.manual_axes):
    return local(q, k, v, seg)
  batch, heads = _mesh_specs(mesh, q.shape[0], h, kvh)
  qs, rows = P(batch, None, heads, None), P(batch, None)
  sharded = jax.shard_map(local, in_specs=(qs, qs, qs, rows), out_specs=qs, check_vma=False)
  return sharded(q, k, v, seg)
