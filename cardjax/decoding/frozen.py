"""A model split once for many decode calls, and the jitted loops that take either.

Every decoder is one jitted loop fn(graphdef, state, *arrays, **static). Called with an NNX
module, each call splits it (`nnx.split`) and jit hashes the graphdef, a static argument:
milliseconds per call, as much as decoding dozens of tokens of a small model, and the same
for every method, so it would pull every measured speedup towards 1. A `Frozen` model pays
that once: it keeps (graphdef, state) and one compiled loop per decoder with the graphdef
closed over. `make_decoder` freezes its model; the modules' `generate(model, ...)` accept
either. Freeze after training: a Frozen model does not see later updates to the module.
"""

from __future__ import annotations

import functools

import jax
from flax import nnx


class Frozen:
  def __init__(self, model):
    self.graphdef, self.state = nnx.split(model)
    self.cfg = model.cfg
    self._compiled: dict = {}

  def compiled(self, loop: "DecodeLoop"):
    if loop not in self._compiled:
      self._compiled[loop] = jax.jit(functools.partial(loop.fn, self.graphdef),
                                     static_argnames=loop.static)
    return functools.partial(self._compiled[loop], self.state)


def freeze(model) -> Frozen:
  return model if isinstance(model, Frozen) else Frozen(model)


class DecodeLoop:
  """fn(graphdef, state, *args, **static) callable as loop(model, *args, **static)."""

  def __init__(self, fn, static: tuple[str, ...]):
    self.fn, self.static = fn, static
    self.jitted = jax.jit(fn, static_argnames=("graphdef",) + static)
    functools.update_wrapper(self, fn)

  def __call__(self, model, *args, **static):
    if isinstance(model, Frozen):
      return model.compiled(self)(*args, **static)
    graphdef, state = nnx.split(model)
    return self.jitted(graphdef, state, *args, **static)

  def _cache_size(self) -> int:
    """Compiled programs of the module path (tests check a sweep does not recompile)."""
    return self.jitted._cache_size()


def decode_loop(*static: str):
  """Decorator: the decoder's loop, its static argument names besides graphdef."""
  return lambda fn: DecodeLoop(fn, static)
