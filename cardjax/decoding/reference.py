"""One full forward without a cache, for the plain-Python references each decoder is
tested against (`*_by_recompute`). Jitted with the graphdef and the mask static, so a
reference loop compiles once per input width: eager op-by-op dispatch made the AR
reference alone take minutes of the test suite."""

from __future__ import annotations

import functools

import jax
import jax.numpy as jnp
import numpy as np
from flax import nnx

from cardjax.attention import CAUSAL, MaskSpec


@functools.partial(jax.jit, static_argnames=("graphdef", "mask"))
def _forward(graphdef, state, tokens, mask):
  return nnx.merge(graphdef, state)(tokens, mask=mask)


def full_logits(model, seq, mask: MaskSpec = CAUSAL):
  """Logits [len(seq), vocab] of one forward over exactly `seq` under `mask`."""
  graphdef, state = nnx.split(model)
  return _forward(graphdef, state, jnp.asarray([seq], jnp.int32), mask)[0]


def causal_logits(model, seq, width: int):
  """Logits [len(seq), vocab] of one causal forward over `seq`, right-padded to `width`
  rounded up to a multiple of 32, so one compile serves a whole loop and prompts of similar
  lengths: under the causal mask the filler is invisible to every real position."""
  tokens = np.zeros(-(-max(width, len(seq)) // 32) * 32, np.int32)
  tokens[:len(seq)] = seq
  return full_logits(model, tokens)[:len(seq)]
