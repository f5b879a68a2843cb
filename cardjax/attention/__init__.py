"""Attention: mask specs and the implementations that honour them."""

from cardjax.attention.masks import BIDIRECTIONAL, CAUSAL, CLEAN, NOISY, MaskSpec
from cardjax.attention.reference import dense_mask, reference_attention

IMPLEMENTATIONS = {"xla": reference_attention}


def attend(q, k, v, spec: MaskSpec, q_meta, k_meta, impl: str = "xla"):
  """Dispatch to the configured implementation (only the XLA reference exists so far)."""
  try:
    fn = IMPLEMENTATIONS[impl]
  except KeyError:
    raise ValueError(f"unknown attention implementation {impl!r}; "
                     f"available: {sorted(IMPLEMENTATIONS)}") from None
  return fn(q, k, v, spec, q_meta, k_meta)


__all__ = ["MaskSpec", "CAUSAL", "BIDIRECTIONAL", "CLEAN", "NOISY", "attend", "dense_mask",
           "reference_attention"]
