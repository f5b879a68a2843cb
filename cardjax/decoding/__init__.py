"""Decoding: AR with a KV cache (the reference, `ar`), MARS threshold decoding (`mars`,
`mars_block`, `mars_verify`), CARD confidence blocks (`card`), MDLM blocks (`mdlm`), their
planners (DUS, EB, CB: `planners`) and the method table the CLI uses (`methods`)."""

from cardjax.decoding.ar import generate, greedy_by_recompute
from cardjax.decoding.prompts import Generation, left_pad

__all__ = ["Generation", "generate", "greedy_by_recompute", "left_pad"]
