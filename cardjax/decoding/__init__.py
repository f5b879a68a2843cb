"""Decoding: AR with a KV cache (the reference) and MARS threshold decoding (`cardjax.decoding.mars`).
CARD blocks, DUS and EB/CB follow."""

from cardjax.decoding.ar import Generation, generate, greedy_by_recompute
from cardjax.decoding.prompts import left_pad

__all__ = ["Generation", "generate", "greedy_by_recompute", "left_pad"]
