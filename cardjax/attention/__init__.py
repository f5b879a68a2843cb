"""Attention: mask specs and the implementations that honour them."""

from cardjax.attention.masks import BIDIRECTIONAL, CAUSAL, CLEAN, NOISY, MaskSpec
from cardjax.attention.reference import cache_attention, dense_mask, reference_attention
from cardjax.attention import select
from cardjax.attention.select import IMPLEMENTATIONS, AttentionImplError
from cardjax.attention.structured import structured_attention
from cardjax.attention import xla

# "xla": the dense reference, except the two-stream kinds (dual_stream, bd3lm) over a
# self-attention row [2L], which take the structured path (equal under its layout contract,
# see cardjax/attention/structured.py). Set False (or pass structured=False) to force the
# dense reference everywhere; it is read when attend is traced.
STRUCTURED_TWO_STREAM = True


def _structured(structured: bool | None) -> bool:
  return STRUCTURED_TWO_STREAM if structured is None else structured


def xla_attention(q, k, v, spec: MaskSpec, q_meta, k_meta, structured: bool | None = None):
  return xla.xla_attention(q, k, v, spec, q_meta, k_meta, _structured(structured))


def attend(q, k, v, spec: MaskSpec, q_meta, k_meta, impl: str = "xla",
           structured: bool | None = None, interpret: bool | None = None):
  """Attention by the implementation `impl` names (cardjax/attention/select.py: auto, xla,
  splash, pallas_gpu, cudnn), resolved when traced; an explicit kernel that cannot serve
  the call raises AttentionImplError with the fix.

  structured: for impl "xla", whether the two-stream kinds use the structured path
  (None = the module's STRUCTURED_TWO_STREAM; False = the dense reference).
  interpret: run a Pallas kernel in interpret mode (None = the CARDJAX_ATTENTION_INTERPRET
  environment variable).
  """
  chosen = select.choose(impl, spec, q.shape, k.shape, q.dtype, interpret=interpret)
  return select.run(chosen, q, k, v, spec, q_meta, k_meta, interpret=interpret,
                    structured=_structured(structured))


__all__ = ["MaskSpec", "CAUSAL", "BIDIRECTIONAL", "CLEAN", "NOISY", "STRUCTURED_TWO_STREAM",
           "IMPLEMENTATIONS", "AttentionImplError", "attend", "cache_attention", "dense_mask",
           "reference_attention", "structured_attention"]
