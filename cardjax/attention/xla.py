"""The "xla" implementation: the dense reference, except the two-stream kinds (dual_stream,
bd3lm) over a self-attention row [2L], which take the structured path when asked (equal
under its layout contract, see structured.py), as does a [clean | compact noisy] row."""

from cardjax.attention.masks import MaskSpec
from cardjax.attention.reference import reference_attention
from cardjax.attention.structured import TWO_STREAM_KINDS, structured_attention


def xla_attention(q, k, v, spec: MaskSpec, q_meta, k_meta, structured: bool = True):
  if (structured and spec.kind in TWO_STREAM_KINDS and q.shape[1] == k.shape[1]
      and (spec.compact or q.shape[1] % 2 == 0)):
    return structured_attention(q, k, v, spec, q_meta, k_meta)
  return reference_attention(q, k, v, spec, q_meta, k_meta)
