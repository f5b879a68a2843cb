"""Shared prompt prefixes: the KV cache of a prefix that many prompts start with, computed
once and copied into every row that starts with it.

A chat server's prompts share their opening (the template's system turn: about 30 of a
short SmolLM2 chat prompt's 42 tokens). Prefilling it again for every request is most of
the prefill, and on a CPU the prefill is compute-bound: a 16-row admission spends as long
on the repeated prefix as the rows then spend decoding. A `PrefixStore` keeps the KV of a
few such prefixes; the SlotPool prefills only what follows one.

Prefixes are learned, not configured: a prompt that shares at least `page` tokens with the
previous one makes their common prefix, rounded down to a multiple of `page`, an entry
(the rounding keeps the entries, and the prefill programs compiled per prefix length, few).
A caller that knows the prefix in advance (the server's chat template) adds it.
The cached keys are those a full prefill would compute at the same positions, so a row
decodes what it would without the store (up to the float rounding of another matmul
shape).
"""

from __future__ import annotations

import collections
import functools
import threading

import jax
import jax.numpy as jnp
from flax import nnx

from cardjax.decoding.frozen import freeze
from cardjax.errors import CardjaxError
from cardjax.model.cache import KVCache

PAGE = 16  # prefix lengths are multiples of this
ENTRIES = 8  # prefixes kept, least recently used dropped first


def _prefix_kv(graphdef, params, tokens):
  """The cache of one prompt prefix `tokens` [1, P] at positions 0..P-1 (segment 1)."""
  model = nnx.merge(graphdef, params)
  p = tokens.shape[1]
  cache = KVCache.create(model.cfg, 1, p)
  _, cache = model.forward_cached(tokens, cache, positions=jnp.arange(p)[None],
                                  segment_ids=jnp.ones_like(tokens),
                                  logits_at=jnp.zeros((1, 1), jnp.int32))
  return cache


def prepend(prefix: KVCache, cache: KVCache) -> KVCache:
  """`cache` (empty, b rows) after a stored prefix's P slots: each row's first P slots are
  the prefix's one row, written up to P (the index)."""
  p = prefix.slots
  new = {}
  for name in ("k", "v", "positions", "streams", "segments"):
    mine, theirs = getattr(cache, name), getattr(prefix, name)
    axis = 3 if mine.ndim == 5 else 1  # the slots axis
    shape = list(mine.shape)
    shape[axis] = p
    new[name] = jnp.concatenate([jnp.broadcast_to(theirs, shape), mine], axis=axis)
  return KVCache(**new, index=jnp.int32(p))


def common_length(a, b) -> int:
  """How many leading tokens `a` and `b` share."""
  n = 0
  for x, y in zip(a, b):
    if x != y:
      break
    n += 1
  return n


class PrefixStore:
  """Up to `entries` prefixes (token tuples) and their KV caches; page=0 turns it off.
  With `background` (a concurrent.futures executor: a server's) a learned prefix's KV is
  computed there, its program compiled off the decode thread, and the prefix is found only
  once it is ready; the store is safe to use from both threads."""

  def __init__(self, model, page: int = PAGE, entries: int = ENTRIES, background=None):
    if page < 0 or entries < 1:
      raise CardjaxError(f"prefix page={page} must be >= 0 (0: off) and entries={entries} "
                         ">= 1")
    self.model, self.page, self.limit = freeze(model), page, entries
    self.entries: collections.OrderedDict = collections.OrderedDict()
    self.last: tuple | None = None  # the previous prompt, to learn a prefix from
    self._kv = jax.jit(functools.partial(_prefix_kv, self.model.graphdef))
    self.background, self._lock, self._queued = background, threading.RLock(), set()

  def find(self, prompt) -> tuple:
    """The longest stored prefix `prompt` continues past (at least one token after it),
    or () when none."""
    best = ()
    with self._lock:
      for prefix in self.entries:
        if len(best) < len(prefix) < len(prompt) and tuple(prompt[:len(prefix)]) == prefix:
          best = prefix
    return best

  def lookup(self, prompt) -> tuple[tuple, KVCache | None]:
    """(find(prompt), its KV marked as recently used, or None when none), at once: a
    background add cannot drop the entry between the two."""
    with self._lock:
      prefix = self.find(prompt)
      return prefix, self.cache(prefix) if prefix else None

  def learn(self, prompt) -> None:
    """Remember the prefix `prompt` shares with the previous prompt when no entry covers
    it and it is at least a page (rounded down to pages, leaving a token after it)."""
    prompt = tuple(prompt)
    last, self.last = self.last, prompt
    if not self.page or last is None or self.find(prompt):
      return
    n = min(common_length(prompt, last), len(prompt) - 1) // self.page * self.page
    if n >= self.page:
      if self.background is None:
        self.add(prompt[:n])
      elif prompt[:n] not in self._queued:
        self._queued.add(prompt[:n])
        self.background.submit(self.add, prompt[:n])

  def add(self, prefix) -> tuple:
    """Compute and keep the KV of `prefix` (the least recently used entry makes room)."""
    prefix = tuple(prefix)
    if prefix not in self.entries:
      kv = self._kv(self.model.state, jnp.asarray([prefix], jnp.int32))
      with self._lock:
        self.entries[prefix] = kv
        while len(self.entries) > self.limit:
          self.entries.popitem(last=False)
        self._queued.discard(prefix)
    return prefix

  def cache(self, prefix: tuple) -> KVCache:
    """The KV of a stored prefix, marked as recently used."""
    with self._lock:
      self.entries.move_to_end(prefix)
      return self.entries[prefix]

  def spec(self, length: int):
    """Shapes of a `length`-token prefix's cache (for ahead-of-time compiles)."""
    return jax.eval_shape(lambda: KVCache.create(self.model.cfg, 1, length))
