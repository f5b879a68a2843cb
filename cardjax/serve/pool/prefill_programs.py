"""Which prefill programs a `SlotPool` (slots.py) runs, and compiling them ahead of use.

A prefill's shape is (prefill batch, stored prefix length, padded prompt width); each shape
is one compiled program. The widths come from a ladder (`widths`), so a server compiles a
few programs per prefill batch however long prompts get, all of them before its first
request (`compile_all`). Programs are compiled ahead of time and kept in a dict shared by
the model's pools (a jitted call would not reuse an ahead-of-time compile). A learned
prefix's programs compile on a background executor when the pool has one (`ready`): until
they are ready, its requests prefill without the prefix, so no request waits for a compile.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp

from cardjax.serve.pool.prefixes import PrefixStore


class PrefillPrograms:
  """A pool's prefill programs.

  jitted: the model's jitted prefill; compiled: the model's {key: program} (slots.jitted());
  state: the model's weights; staging: the ShapeDtypeStructs of the pool's prefill buffer;
  sizes: the prefill batch sizes; bucket: the width ladder's step; slots, window: the
  pool's slots and decode window; limit: the longest prompt a row takes; background: an
  executor for compiles off the caller's thread (None: compile where first needed); store:
  a stored.ProgramStore that keeps the compiled programs on disk (None: jax's caches only),
  context: what the prefill closes over (the model's structure), for the store's key."""

  def __init__(self, jitted, compiled: dict, state, staging, prefixes: PrefixStore,
               sizes: tuple[int, ...], *, bucket: int, slots: int, window: int, limit: int,
               background=None, store=None, context: str = ""):
    self.jitted, self.compiled, self.state, self.staging = jitted, compiled, state, staging
    self.prefixes, self.sizes, self.bucket = prefixes, sizes, bucket
    self.slots, self.window, self.limit = slots, window, limit
    self.background, self._queued = background, set()
    self.store, self.context = store, context
    self.used: dict = {}  # (rows, prefix, width) -> the compiled prefill this pool ran

  def widths(self, prefix: int = 0) -> list[int]:
    """The padded widths prompts prefill at after a `prefix`-token stored prefix: a ladder
    of bucket multiples growing by about half (1, 2, 3, 4, 6, 8, 12, ... buckets), so that
    the programs to compile are a few per prefill batch however long prompts get (a long
    prompt pads by at most half), up to the widest that leaves room for a window (2 at
    least: the prefill reads width - 1 >= 1 tokens)."""
    top = max(self.slots - self.window - prefix + 1, 2)
    ladder, k = [], 1
    while k * self.bucket < top:
      ladder.append(k * self.bucket)
      k = k + 1 if k < 4 else k // 2 * 3 if k & (k - 1) == 0 else k // 3 * 4
    return ladder + [top]

  def width(self, length: int, prefix: int = 0) -> int:
    """The width `length` prompt tokens after a `prefix`-token stored prefix prefill at:
    the narrowest of widths(prefix) that holds them."""
    return next(w for w in self.widths(prefix) if w >= length)

  def ready(self, prefix: int, width: int) -> bool:
    """Whether the prefills after a `prefix`-token stored prefix at `width` are compiled
    for every prefill batch. In the background mode they are compiled off the caller's
    thread (queued here on first ask), and until then the caller prefills without the
    prefix."""
    if self.background is None:
      return True
    if all(self._key(rows, prefix, width) in self.compiled for rows in self.sizes):
      return True  # by this pool or another of the model's
    if (prefix, width) not in self._queued:
      self._queued.add((prefix, width))
      self.background.submit(lambda: [self.program(rows, width, prefix)
                                      for rows in self.sizes])
    return False

  def program(self, rows: int, width: int, prefix: int = 0):
    """The prefill of `rows` prompts padded to `width` after a stored prefix of `prefix`
    tokens (0: none), compiled on first use."""
    if (rows, prefix, width) not in self.used:
      key = self._key(rows, prefix, width)
      if key not in self.compiled:  # the model's other pools may have compiled it
        spec = jax.ShapeDtypeStruct((rows, width), jnp.int32)
        args = (self.state, self.staging, spec, spec, spec)
        if prefix:
          args += (self.prefixes.spec(prefix),)
        self.compiled[key] = (self.jitted.lower(*args).compile() if self.store is None else
                              self.store.program("prefill", self.jitted, args,
                                                 context=self.context))
      self.used[rows, prefix, width] = self.compiled[key]
    return self.used[rows, prefix, width]

  def _key(self, rows: int, prefix: int, width: int) -> tuple:
    """A prefill program's key among the model's compiled ones."""
    return (rows, prefix, width, self.staging.k.shape, self.staging.k.dtype)

  def compile_all(self, max_width: int | None = None, prefixes=(0,), log=None) -> int:
    """Compile, without running one, the prefill of every prefill batch size, stored prefix
    length in `prefixes` and width that a prompt of up to `max_width` tokens (None: the
    longest a row takes) prefills at. Returns the number of programs."""
    n = 0
    longest = self.limit if max_width is None else min(max_width, self.limit)
    for p in prefixes:
      if p + 1 > self.limit:
        continue
      needed = self.width(max(longest - p, 1), p)
      for rows in self.sizes:
        for width in [w for w in self.widths(p) if w <= needed]:
          if log:
            log(f"prefill batch {rows}, width {width}" + (f" after {p} cached" if p else ""))
          self.program(rows, width, p)
          n += 1
    return n
