"""Rows that keep their KV cache between decode calls: continuous batching for AR and MARS.

The one-shot decoders (decoding/ar.py, mars.py) prefill a batch, decode it to the end and
drop the cache. A server whose requests arrive and finish at different times would then
re-prefill every row at every call. A `SlotPool` instead owns a cache of `rows x slots`
that lives across calls:

  admit_many([(key, prompt, tau, max_new_tokens[, Sampling]), ...])
                       prefill prompts into free rows (one forward per prompt width for up to
                       prefill_rows prompts, written into their rows in place); the rows then
                       decode with the others. admit(key, prompt, ...) admits one.
  step(forwards)       up to `forwards` forwards for every live row (one jitted while loop,
                       leaving early when no row is live); returns each key's new tokens
  launch(forwards) / collect(flight)
                       the same step split in two: launch dispatches it and returns, collect
                       waits for its results; between them the host may release rows, admit
                       new ones and launch the next step, which the device runs after this
                       one (the server's overlap: scheduler.py)
  release(key)         the key's request is over (or its client left); its row is free

Rows are named by the caller's keys: a tier change (below) renumbers them. Each row keeps
its own tau and its own sampling settings (`Sampling`: temperature, top_p, seed), so greedy
and sampled requests, seeded or not, decode in the same step; a row's draws are keyed by its
seed and position (sampling.row_uniforms), not by the step, so a seeded request gives the
same tokens alone or beside others.

AR feeds one token per row per forward. MARS reads a window [w pending | B masks] per row
and accepts per row by its own tau (decoding/mars.py). `window` "fit" (the default where a
step tests its loop's condition after every forward, a CPU) reads the narrowest compiled w
that holds every live row's pending run, as the one-shot decoder does: a forward costs
about its tokens there. "full" (the default with unroll > 1, an accelerator, where a
small-batch forward costs its weights whatever its width and a change of width would need
a test of the loop's condition) always reads w = B. A row stops by itself at a stop token,
at its token budget, or when its next window would not fit the slots (the caller finishes
it for length).

Batch tiers: a forward costs about its rows on a CPU, so the pool keeps the smallest of
`batch_sizes` that holds its live rows. It grows when an admit needs a row and shrinks when
the live rows fit a smaller tier, by one gather of the live rows into a new cache (the
live rows keep their slots, so no row is re-prefilled).

Spans: every forward's attention reads every slot of the cache, used or not, so the cache
holds only `span` slots, the smallest of the span buckets (span_min, 2 span_min, ...,
slots) that the next step can reach: before each step the pool works out, from each row's
write index and token budget, the furthest slot the step can write, and grows or shrinks
the span by one copy of the cache. A 64-row cache of SmolLM2 at 256 slots is 755 MB, more
than the weights' 540 MB: short requests should not pay for the longest one a row may
hold. Every call has a static shape: (tier, span) for the step, (prefill batch, prompt width
bucket) for the prefill.

Batched admission: requests that arrive together (a server's round admits every row that
freed up) share one prefill forward per width bucket. A one-row forward is bound by reading
the weights and a many-row one by its matmuls, so 16 prompts prefill in well under the time
of 16 one-row forwards (docs/serving.md), and prefills are much of a short request's work.

Greedy tokens equal ar.generate / mars.generate for the same prompts (tests/test_slots.py):
a row's tokens do not depend on when it was admitted or which rows it shared calls with.
"""

from __future__ import annotations

import dataclasses
import functools

import jax
import jax.numpy as jnp
import numpy as np

from cardjax.decoding.frozen import freeze
from cardjax.decoding.mars import check_args, pending_widths
from cardjax.decoding.prompts import BUCKET, left_pad
from cardjax.errors import CardjaxError
from cardjax.model.cache import KVCache
from cardjax.serve.pool import programs, stored
from cardjax.serve.pool.prefill_programs import PrefillPrograms
from cardjax.serve.pool.prefixes import PAGE, PrefixStore
from cardjax.serve.pool.programs import Rows

METHODS = ("ar", "mars")


@dataclasses.dataclass(frozen=True)
class Sampling:
  """A row's sampling settings: greedy at temperature 0 (the default), else top-p draws
  keyed by `seed` (an unsigned 32-bit value) and the row's position."""
  temperature: float = 0.0
  top_p: float = 1.0
  seed: int = 0


GREEDY = Sampling()
# The most prompts one prefill forward takes by default: 16 rows already keep a CPU's
# matmuls busy, and a 64-row prefill would stall every live row for seconds (and be the
# largest program to compile).
PREFILL_ROWS = 16


def check_pool_options(span_min: int, prefill_rows: int, prefix_page: int,
                       flags: bool = False) -> None:
  """The pool's option checks, shared with `cardjax serve`, which runs them before the model
  loads and names its flags (flags=True: --span-min, not span_min)."""
  def name(option: str) -> str:
    return "--" + option.replace("_", "-") if flags else option

  if span_min < 0:
    raise CardjaxError(f"{name('span_min')}={span_min} must be >= 0 (0: every step reads all "
                       "slots)")
  if prefill_rows < 1:
    raise CardjaxError(f"{name('prefill_rows')}={prefill_rows} must be >= 1 (1: one prefill "
                       "forward per prompt)")
  if prefix_page < 0:
    raise CardjaxError(f"{name('prefix_page')}={prefix_page} must be >= 0 (0: no prefix cache)")


# The programs that take no model: one jit (and so one cache of compiled shapes) for all.
_put = jax.jit(programs.put_rows, donate_argnums=(0, 1))
_gather = jax.jit(programs.gather, static_argnames="span")  # a new shape: no donation
_release = jax.jit(programs.release_row, donate_argnums=(0, 1))


@functools.cache
def jitted(graphdef):
  """A model's jitted prefill and step and its ahead-of-time compiled prefills ({(rows,
  prefix, width, staging shape): program}), one set per model structure."""
  prefill = jax.jit(functools.partial(programs.prefill, graphdef), donate_argnums=(1,))
  step = jax.jit(functools.partial(programs.step, graphdef), donate_argnums=(1, 2),
                 static_argnames=("forwards", "method", "block", "rule", "limit", "unroll",
                                  "window"))
  return prefill, step, {}


class SlotPool:
  """A KV cache of rows that persist across decode calls (see the module docstring)."""

  def __init__(self, model, method: str = "ar", *, slots: int, batch_sizes=(1, 4, 16),
               block: int = 4, rule: str = "prob", stop_ids=(), pad_id: int = 0,
               bucket: int = BUCKET, span_min: int = 64, prefill_rows: int = PREFILL_ROWS,
               prefix_page: int = PAGE, prefixes: PrefixStore | None = None,
               background=None, unroll: int = 1, window: str | None = None,
               store: stored.ProgramStore | None = None):
    if method not in METHODS:
      raise CardjaxError(f"SlotPool decodes {METHODS}, not {method!r}")
    self.model = freeze(model)
    cfg = self.model.cfg
    if method == "mars":
      check_args(0.5, block, cfg.mask_token_id, rule)
    self.method, self.rule = method, rule
    if unroll < 1:
      raise CardjaxError(f"unroll={unroll} must be >= 1 (forwards per test of a step's loop)")
    self.unroll = unroll
    # MARS's window (module docstring): "fit" unless a step runs several forwards per test.
    self.mars_window = window or ("fit" if unroll == 1 else "full")
    pending_widths(block, self.mars_window)  # a bad name: CardjaxError
    if self.mars_window == "fit" and unroll > 1:
      raise CardjaxError(f"window='fit' changes width from forward to forward, so it tests "
                         f"the step's loop after each one: use unroll=1, not {unroll}, or "
                         "window='full'")
    self.block = block if method == "mars" else 0
    self.window = 1 if method == "ar" else 2 * block
    self.stride = 1 if method == "ar" else block  # the most a row's index moves a forward
    if slots > cfg.max_position_embeddings + self.window:
      slots = cfg.max_position_embeddings + self.window
    self.slots = slots
    check_pool_options(span_min, prefill_rows, prefix_page)
    self.spans = [slots]  # span buckets, doubling from span_min up to slots
    while span_min and self.spans[0] // 2 >= span_min:
      self.spans.insert(0, self.spans[0] // 2)
    self.batch_sizes = tuple(sorted(set(batch_sizes)))
    self.stop_ids = np.asarray(list(stop_ids) or [-1], np.int32)
    self.pad_id, self.bucket = pad_id, bucket or BUCKET
    g = self.model.graphdef
    # Prefill batches: the batch sizes up to prefill_rows (at least the smallest).
    self.prefill_sizes = tuple(b for b in self.batch_sizes if b <= prefill_rows)
    self.prefill_sizes = self.prefill_sizes or self.batch_sizes[:1]
    # The model's programs, shared by its pools (jitted(): another pool of the same model,
    # e.g. one whose requests ignore stop tokens, compiles nothing new).
    prefill, self._step, compiled = jitted(g)
    # Compiled programs kept on disk (stored.py): the given store, else the one of the
    # compilation cache `cardjax serve` set, else none (jax's jit and its caches).
    self.store = store or stored.default()
    # The model that step and prefill close over and take first, as the store names it.
    self._context = stored.model_context(g, self.model.state) if self.store else ""
    # Stored prefixes (a store shared with the model's other pools, or its own).
    self.prefixes = prefixes or PrefixStore(self.model, prefix_page, background=background)
    self.owner: list = []  # per row: the caller's key, None when free
    # Host copies of each row's write index, token budget and liveness: what the span
    # needs, without reading the device before every step.
    self.index = np.zeros(0, np.int64)
    self.budget = np.zeros(0, np.int64)
    self.flown = np.zeros(0, np.int64)  # forwards launched for the row, not yet collected
    self.live = np.zeros(0, bool)
    self.cache = self.rows = None
    # The prefill buffer: each prefill writes its rows here, put_rows copies them out.
    self.staging = self._commit(KVCache.create(cfg, self.prefill_sizes[-1], slots).per_row())
    # Its shapes, for compiles on another thread while the buffer is donated to a prefill.
    staging_spec = jax.tree.map(
        lambda x: jax.ShapeDtypeStruct(x.shape, x.dtype, sharding=x.sharding), self.staging)
    # The prefill programs; with a server's `background` executor, a learned prefix's
    # compile off the decode thread.
    self.programs = PrefillPrograms(
        prefill, compiled, self.model.state, staging_spec, self.prefixes, self.prefill_sizes,
        bucket=self.bucket, slots=slots, window=self.window, limit=self.prompt_limit(),
        background=background, store=self.store, context=self._context)
    self._resize(self.batch_sizes[0], [], self.spans[0])

  # -- rows ---------------------------------------------------------------------------
  @property
  def tier(self) -> int:
    return len(self.owner)

  def live_rows(self) -> int:
    return sum(o is not None for o in self.owner)

  def capacity(self) -> int:
    return self.batch_sizes[-1]

  @property
  def span(self) -> int:
    return self.cache.slots

  def reach(self, forwards: int) -> int:
    """Slots the next `forwards` forwards (after those in flight) can write into, over every
    row: a live row moves its index by at most `stride` a forward and by at most its
    pending tokens and budget in all, then writes one window; a stopped or free row
    rewrites its window in place."""
    moved = np.minimum((self.flown + forwards - 1) * self.stride, self.stride + self.budget)
    far = self.index + np.where(self.live, moved, 0) + self.window
    return int(min(far.max(initial=self.window), self.slots))

  def span_for(self, slots: int) -> int:
    return next(s for s in self.spans if s >= slots)

  def prompt_limit(self) -> int:
    """The longest prompt a row takes: room for one window after it."""
    return min(self.slots, self.model.cfg.max_position_embeddings) - self.window

  def _resize(self, tier: int, order: list[int], span: int) -> None:
    """Rows `order` (old row numbers) become rows 0.. of a cache of `tier` rows and `span`
    slots."""
    order = list(order) + [-1] * (tier - len(order))
    if self.cache is None:
      self.cache, self.rows = self._empty(tier, span)
      self.owner = [None] * tier
      self.index, self.budget = np.zeros(tier, np.int64), np.zeros(tier, np.int64)
      self.flown = np.zeros(tier, np.int64)
      self.live = np.zeros(tier, bool)
      return
    self.cache, self.rows = self._run("gather", _gather, self.cache, self.rows,
                                      jnp.asarray(order, jnp.int32), span=span)
    self.owner = [self.owner[i] if i >= 0 else None for i in order]
    keep = np.asarray(order) >= 0
    at = np.maximum(order, 0)
    self.index = np.where(keep, self.index[at], 0)
    self.budget = np.where(keep, self.budget[at], 0)
    self.flown = np.where(keep, self.flown[at], 0)
    self.live = keep & self.live[at]

  def _empty(self, tier: int, span: int) -> tuple[KVCache, Rows]:
    """A cache and row state with no row live."""
    width = max(self.block, 1)
    state = (KVCache.create(self.model.cfg, tier, span).per_row(),
             Rows(pending=jnp.zeros((tier, width), jnp.int32),
                  n_pending=jnp.ones((tier,), jnp.int32),
                  committed=jnp.ones((tier,), jnp.int32), live=jnp.zeros((tier,), bool),
                  tau=jnp.ones((tier,), jnp.float32), budget=jnp.zeros((tier,), jnp.int32),
                  temperature=jnp.zeros((tier,), jnp.float32),
                  top_p=jnp.ones((tier,), jnp.float32), seed=jnp.zeros((tier,), jnp.uint32)))
    return self._commit(state)

  @staticmethod
  def _commit(state):
    """Committed to the device, as the jitted calls' outputs are: a first call on
    uncommitted arrays would compile each program a second time. Copies: create()
    shares one zeros buffer between k and v, and the calls donate each."""
    device = jax.devices()[0]
    return jax.tree.map(lambda x: jax.device_put(jnp.copy(x), device), state)

  def compile_steps(self, forwards: int, log=None) -> int:
    """Compile, before serving, what the pool runs at each (tier, span): the step of
    `forwards` forwards (it runs no forward: no row is live), putting prefilled rows,
    freeing a row, and the gathers to every other tier at this span and every other span
    at this tier (what admits, releases and span changes run). Returns the number of
    programs."""
    n = 0
    s = self.staging.index.shape[0]
    for tier in self.batch_sizes:
      for span in self.spans:
        if log:
          log(f"step batch {tier}, span {span}")
        cache, rows = self._empty(tier, span)
        cache, rows, _ = self._call_step(cache, rows, forwards)
        cache, rows = self._run("release", _release, cache, rows, np.int32(0))
        ids = np.full(s, tier, np.int32)  # every id dropped: no row changes
        zeros, ones = np.zeros(s, np.int32), np.ones(s, np.float32)
        cache, rows = self._run("put", _put, cache, rows, self.staging, ids, zeros, zeros,
                                ones, zeros, ones, ones, np.zeros(s, np.uint32))
        for other, other_span in ([(t, span) for t in self.batch_sizes if t != tier] +
                                  [(tier, x) for x in self.spans if x != span]):
          self._run("gather", _gather, cache, rows, jnp.asarray(np.full(other, -1), jnp.int32),
                    span=other_span)
        n += 3 + len(self.batch_sizes) + len(self.spans) - 2
    return n

  def whole(self, forwards: int) -> int:
    """`forwards` rounded up to a multiple of `unroll`: what a step of them runs at most."""
    return -(-forwards // self.unroll) * self.unroll

  def _call_step(self, cache, rows, forwards, run=None):
    """The step program compiled for `forwards` forwards, run for `run` (default all)."""
    return self._run(
        "step", self._step, self.model.state, cache, rows, self.stop_ids,
        np.int32(self.pad_id), np.int32(self.model.cfg.mask_token_id),
        np.int32(self.whole(forwards if run is None else run)), skip=1,
        forwards=self.whole(forwards), method=self.method, block=self.block, rule=self.rule,
        limit=self.slots, unroll=self.unroll,
        window=self.mars_window if self.method == "mars" else "full")

  def _run(self, name: str, jitted, *args, skip: int = 0, **static):
    """jitted(*args, **static), through the program store when the pool has one. skip: the
    leading arguments that are the model's (its weights, the same every call): the
    program's key then names the model by the pool's context."""
    if self.store is None:
      return jitted(*args, **static)
    program = self.store.program(name, jitted, args, static, self._context if skip else "",
                                 skip)
    return program(*args)

  def _fit(self, need: int) -> None:
    """The smallest tier holding `need` rows, the live rows moved to its first rows."""
    tier = next((b for b in self.batch_sizes if b >= need), None)
    if tier is None:
      raise CardjaxError(f"{need} rows do not fit the largest batch size {self.capacity()}")
    if tier != self.tier:
      self._resize(tier, [i for i, o in enumerate(self.owner) if o is not None], self.span)

  def admit(self, key, prompt, tau: float = 1.0, max_new_tokens: int = 1,
            sampling: Sampling = GREEDY) -> None:
    """Prefill `prompt` into a free row owned by `key` (hashable, not None)."""
    self.admit_many([(key, prompt, tau, max_new_tokens, sampling)])

  def admit_many(self, requests) -> int:
    """Prefill each (key, prompt, tau, max_new_tokens[, sampling]) into a free row owned
    by its key (sampling: a `Sampling`, greedy when left out): one forward per stored
    prefix (prefixes.py), width bucket of what follows it and prefill_rows prompts.
    Returns the prompt tokens read from stored prefixes."""
    requests = [tuple(r[:4]) + (r[4] if len(r) > 4 else GREEDY,) for r in requests]
    keys = [r[0] for r in requests]
    for key, prompt, _, _, sampling in requests:
      if not (sampling.temperature >= 0 and 0 < sampling.top_p <= 1 and
              0 <= sampling.seed < 2**32):
        raise CardjaxError(f"{sampling} is out of range: temperature >= 0, top_p in (0, 1], "
                           "seed in [0, 2**32)")
      if key is None or key in self.owner or keys.count(key) > 1:
        raise CardjaxError(f"key {key!r} is None or already owns a row; give each request "
                           "its own key")
      if not prompt:
        raise CardjaxError("an empty prompt cannot be admitted; give at least one token")
      if len(prompt) > self.prompt_limit():
        raise CardjaxError(f"a prompt of {len(prompt)} tokens leaves no room in {self.slots} "
                           f"slots (at most {self.prompt_limit()}); shorten it")
    if self.live_rows() + len(requests) > self.capacity():
      raise CardjaxError(f"all {self.capacity()} rows are busy; release one first")
    if not requests:
      return 0
    self._fit(self.live_rows() + len(requests))
    for r in requests:  # all first: a batch's first prompt then finds what it shares
      self.prefixes.learn(r[1])
    shapes, kv = [], {}  # per request: (its stored prefix, the width of what follows)
    for r in requests:
      prefix, kv[prefix] = self.prefixes.lookup(r[1])
      width = self.programs.width(len(r[1]) - len(prefix), len(prefix))
      if prefix and not self.programs.ready(len(prefix), width):  # compiling: prefill it all
        prefix, width = (), self.programs.width(len(r[1]))
      shapes.append((prefix, width))
    reach = max(len(prefix) + width - 1 for prefix, width in shapes)
    if reach > self.span:  # the prefilled slots must fit the span
      self._resize(self.tier, range(self.tier), self.span_for(reach))
    free = iter([row for row, owner in enumerate(self.owner) if owner is None])
    cap = self.prefill_sizes[-1]
    for prefix, width in sorted(set(shapes), key=lambda s: (len(s[0]), s[0], s[1])):
      group = [r for r, shape in zip(requests, shapes) if shape == (prefix, width)]
      for i in range(0, len(group), cap):
        self._prefill_rows(group[i:i + cap], [next(free) for _ in group[i:i + cap]], width,
                           prefix, kv.get(prefix))
    return sum(len(prefix) for prefix, _ in shapes)

  def _prefill_rows(self, requests, rows: list[int], width: int, prefix: tuple = (),
                    kv=None) -> None:
    """One prefill forward of `requests` (at most prefill_rows), which all start with the
    stored `prefix` (or none), into rows `rows`."""
    n, p = len(requests), len(prefix)
    size = next(b for b in self.prefill_sizes if b >= n)
    prompts = [r[1] for r in requests] + [list(prefix) + [self.pad_id]] * (size - n)
    tokens, positions, segments, _ = left_pad([q[p:] for q in prompts], self.pad_id,
                                              bucket=width)
    args = (self.model.state, self.staging, tokens, positions, segments)
    if p:
      args += (kv,)
    self.staging = self.programs.program(size, width, p)(*args)
    s = self.staging.index.shape[0]  # staging rows: those past n are not put (dropped ids)
    ids = np.asarray(rows + [self.tier] * (s - n), np.int32)
    prompts += [[self.pad_id]] * (s - size)
    last = np.asarray([q[-1] for q in prompts], np.int32)
    length = np.asarray([len(q) for q in prompts], np.int32)
    tau = np.asarray([r[2] for r in requests] + [1.0] * (s - n), np.float32)
    budget = np.asarray([r[3] for r in requests] + [0] * (s - n), np.int32)
    sampling = [r[4] for r in requests] + [GREEDY] * (s - n)
    self.cache, self.rows = self._run(
        "put", _put, self.cache, self.rows, self.staging, ids, last, length, tau, budget,
        np.asarray([x.temperature for x in sampling], np.float32),
        np.asarray([x.top_p for x in sampling], np.float32),
        np.asarray([x.seed for x in sampling], np.uint32))
    for (key, _, _, budget, _), row in zip(requests, rows):
      self.owner[row] = key
      self.index[row], self.budget[row], self.live[row] = p + width - 1, budget, True
      self.flown[row] = 0

  def compile_prefills(self, max_width: int | None = None, prefixes=(0,), log=None) -> int:
    """Compile, before serving, the prefills a prompt of up to `max_width` tokens (None:
    the longest a row takes) runs after each stored prefix length in `prefixes`
    (PrefillPrograms.compile_all). Returns the number of programs."""
    return self.programs.compile_all(max_width, prefixes, log)

  def release(self, key) -> None:
    """Free `key`'s row (its request ended or its client left). A tier the remaining rows
    no longer need is given up at the next launch."""
    row = self.owner.index(key)
    self.owner[row] = None
    self.cache, self.rows = self._run("release", _release, self.cache, self.rows,
                                      np.int32(row))
    self.index[row], self.live[row], self.flown[row] = 0, False, 0

  def busy(self) -> bool:
    """Whether a step launched now could decode anything: some row the host counts live
    has budget left beyond the forwards already in flight for it (a live row commits at
    least one token a forward, so a row whose budget those forwards cover has ended)."""
    return bool(np.any(self.live & (self.budget > self.flown)))

  def may_end_in_flight(self) -> bool:
    """Whether a step in flight may end a row by its token budget: the forwards in flight
    for it can commit that many tokens (AR: one a forward, so the row ends for sure; MARS:
    up to B). A stop token can end a row too, which the host cannot foresee."""
    reach = self.flown * self.stride
    return bool(np.any(self.live & (self.flown > 0) & (self.budget <= reach)))

  def launch(self, forwards: int, within: int | None = None) -> "Flight":
    """Dispatch a step of up to `forwards` forwards for the live rows and return at once,
    the results still on their way (`collect` reads them). `within`: the step program to
    run, compiled for that many forwards (default `forwards`) and stopped after
    `forwards`, so that shorter steps compile nothing new. Steps already in flight count
    toward the span: the host plans this one without their results. Before it, a tier the
    live rows no longer need is given up (lazily: a row freed and refilled between two
    steps costs no gather)."""
    live = self.live_rows()
    if next(b for b in self.batch_sizes if b >= max(live, 1)) < self.tier:
      self._fit(live)
    compiled = self.whole(forwards if within is None else within)
    forwards = min(self.whole(forwards), compiled)
    span = self.span_for(self.reach(forwards))
    if span != self.span:
      self._resize(self.tier, range(self.tier), span)
    self.cache, self.rows, packed = self._call_step(self.cache, self.rows, compiled,
                                                    forwards)
    packed.copy_to_host_async()  # starts now; collect waits for it
    self.flown[self.live] += forwards
    return Flight(packed, list(self.owner), self.live.copy(), forwards)

  def collect(self, flight: "Flight"):
    """Wait for a launched step and read its results. Returns (new tokens per key,
    the keys whose rows stopped by themselves with the reason: "stop" (a stop token),
    "budget" (max_new_tokens) or "slots" (no room for another window), forwards per key
    (those that produced its tokens)). A stopped row keeps its key until release; a key
    released while its step ran (its client left) is left out."""
    out, count, used, live, budget, index = programs.unpack(np.asarray(flight.packed))
    where = {key: row for row, key in enumerate(self.owner) if key is not None}
    tokens, ended, fwd = {}, {}, {}
    for row in np.flatnonzero(flight.was_live):
      key = flight.keys[row]
      now = where.get(key)  # tier changes since the launch renumber rows
      if now is None:
        continue
      self.index[now], self.budget[now], self.live[now] = index[row], budget[row], live[row]
      self.flown[now] -= flight.forwards
      tokens[key] = toks = out[row, :count[row]].tolist()
      fwd[key] = int(used[row])
      if not live[row]:
        ended[key] = ("stop" if toks and toks[-1] in self.stop_ids else
                      "budget" if budget[row] <= 0 else "slots")
    return tokens, ended, fwd

  def step(self, forwards: int):
    """Decode up to `forwards` forwards for the live rows, each with its own tau and
    sampling, and wait for them: `collect(launch(forwards))`."""
    return self.collect(self.launch(forwards))


@dataclasses.dataclass
class Flight:
  """A launched step: its packed results (on their way to the host) and what the host knew
  at its launch: each row's key (None: free) and which rows it counted as live."""
  packed: jax.Array
  keys: list
  was_live: np.ndarray
  forwards: int
