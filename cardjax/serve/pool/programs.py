"""The jitted programs a `SlotPool` (slots.py) calls, and the per-row state they carry.

prefill    the KV cache of a batch of prompts (after a stored prefix, when one is given),
           into the pool's prefill buffer
put_rows   write the prefill buffer's rows into the pool's cache, reset their row states
gather     the pool's live rows in a new order, cut or padded to a new span (tier changes)
step       up to `forwards` AR or MARS forwards for every live row, in one while loop,
           and its results packed in one array the host reads (`unpack`)

The pool compiles each for its static shapes; this module holds no state.
"""

from __future__ import annotations

import dataclasses

import jax
import jax.numpy as jnp
from flax import nnx

from cardjax.decoding.mars import judge_window, pending_widths, width_sweep, window_inputs
from cardjax.decoding.sampling import row_uniforms, sample
from cardjax.errors import CardjaxError
from cardjax.model.cache import EMPTY_SEGMENT, KVCache
from cardjax.serve.pool.prefixes import prepend


@dataclasses.dataclass
class Rows:
  """Per-row decode state besides the cache (device arrays, [rows] or [rows, width])."""
  pending: jax.Array  # [rows, max(B, 1)] committed tokens whose keys are not cached yet
  n_pending: jax.Array  # [rows]
  committed: jax.Array  # [rows] the row's length (prompt + generated): the next position
  live: jax.Array  # [rows] bool: decoding (admitted, not stopped)
  tau: jax.Array  # [rows] float32, MARS
  budget: jax.Array  # [rows] tokens the row may still produce
  # Sampling, per row (decoding/sampling.py): greedy at temperature 0; draws keyed by the
  # row's seed and position, so a row samples the same tokens whatever rows share its steps.
  temperature: jax.Array  # [rows] float32
  top_p: jax.Array  # [rows] float32
  seed: jax.Array  # [rows] uint32


jax.tree_util.register_dataclass(Rows, data_fields=[f.name for f in dataclasses.fields(Rows)],
                                 meta_fields=[])


def prefill(graphdef, params, staging: KVCache, tokens, positions, segments, prefix=None):
  """The KV of a batch of prompts, written into the first rows of `staging` (the pool's
  prefill buffer: prefill_rows rows of `slots` slots, donated): each prompt less its last
  token in as many slots as the padded width less one, the row's index there, the slots
  past it stale (put_rows empties them). With `prefix` (a PrefixStore cache of P slots)
  the prompts are what follows that prefix: each row's first P slots are a copy of it and
  the prompts' positions start at P. Writing into one fixed buffer keeps put_rows' shapes
  to the pool's (tier, span), whatever width and batch a prefill had."""
  model = nnx.merge(graphdef, params)
  b, w = tokens.shape
  cache = KVCache.create(model.cfg, b, w - 1)
  if prefix is not None:
    cache = prepend(prefix, cache)
    positions = positions + prefix.slots
  _, cache = model.forward_cached(tokens[:, :-1], cache, positions=positions[:, :-1],
                                  segment_ids=segments[:, :-1],
                                  logits_at=jnp.zeros((b, 1), jnp.int32))

  def write(buf, value):
    return jax.lax.dynamic_update_slice(buf, value.astype(buf.dtype), (0,) * buf.ndim)

  index = jnp.broadcast_to(cache.index, (b,))
  return KVCache(k=write(staging.k, cache.k), v=write(staging.v, cache.v),
                 positions=write(staging.positions, cache.positions),
                 streams=write(staging.streams, cache.streams),
                 segments=write(staging.segments, cache.segments),
                 index=staging.index.at[:b].set(index))


def put_rows(cache: KVCache, rows: Rows, staging: KVCache, row_ids, last, length, tau,
             budget, temperature, top_p, seed):
  """`cache` and `rows` with rows `row_ids` ([n], n = the staging rows; an id past the
  last row is dropped: a row the prefill did not fill) replaced by the staged rows (their
  first `span` slots become the rows', slots past each one's index empty) and fresh row
  states: pending = [last], `length` tokens so far. One call, so an admit is one dispatch
  besides the prefill; its shapes are the pool's (tier, span) only."""
  span = cache.slots
  slot = jnp.arange(span)
  filled = slot[None] < staging.index[:, None]  # [n, span]

  def put(buf, value):
    value = jax.lax.slice_in_dim(value, 0, span, axis=value.ndim - 2 if value.ndim == 5
                                 else 1)
    if buf.ndim == 5:  # [layers, rows, kv_heads, slots, head_dim]
      return buf.at[:, row_ids].set(value, mode="drop")
    return buf.at[row_ids].set(value, mode="drop")

  segments = jnp.where(filled, jax.lax.slice_in_dim(staging.segments, 0, span, axis=1),
                       EMPTY_SEGMENT)
  cache = KVCache(k=put(cache.k, staging.k), v=put(cache.v, staging.v),
                  positions=put(cache.positions, staging.positions),
                  streams=put(cache.streams, staging.streams),
                  segments=cache.segments.at[row_ids].set(segments, mode="drop"),
                  index=cache.index.at[row_ids].set(staging.index, mode="drop"))

  def set_rows(x, value):
    return x.at[row_ids].set(value, mode="drop")

  pending = jnp.zeros((len(last),) + rows.pending.shape[1:], jnp.int32).at[:, 0].set(last)
  rows = Rows(pending=set_rows(rows.pending, pending), n_pending=set_rows(rows.n_pending, 1),
              committed=set_rows(rows.committed, length), live=set_rows(rows.live, True),
              tau=set_rows(rows.tau, tau), budget=set_rows(rows.budget, budget),
              temperature=set_rows(rows.temperature, temperature),
              top_p=set_rows(rows.top_p, top_p), seed=set_rows(rows.seed, seed))
  return cache, rows


def release_row(cache: KVCache, rows: Rows, row):
  """Row `row` freed: not live, its write index back to 0 (a free row rewrites its first
  window, so its old length does not hold the span up). One compiled call per (tier, span),
  which the warm-up compiles, rather than eager updates that compiled in the request path."""
  return (dataclasses.replace(cache, index=cache.index.at[row].set(0)),
          dataclasses.replace(rows, live=rows.live.at[row].set(False)))


def gather(cache: KVCache, rows: Rows, order, *, span: int):
  """The cache and row state of rows `order` (-1: an empty row) in that order, the cache
  cut or padded (empty slots) to `span` slots."""
  take = jnp.maximum(order, 0)
  empty = order < 0

  def fit(x, axis, fill=0):  # slots [0, span): the caller keeps every written one
    x = jax.lax.slice_in_dim(x, 0, min(span, x.shape[axis]), axis=axis)
    pad = [(0, 0)] * x.ndim
    pad[axis] = (0, span - x.shape[axis])
    return jnp.pad(x, pad, constant_values=fill)

  k = fit(jnp.take(cache.k, take, axis=1), 3)
  v = fit(jnp.take(cache.v, take, axis=1), 3)
  segments = fit(jnp.where(empty[:, None], EMPTY_SEGMENT, cache.segments[take]), 1,
                 EMPTY_SEGMENT)
  cache = KVCache(k=k, v=v, positions=fit(cache.positions[take], 1),
                  streams=fit(cache.streams[take], 1), segments=segments,
                  index=jnp.where(empty, 0, cache.index[take]))
  rows = jax.tree.map(lambda x: x[take], rows)
  return cache, dataclasses.replace(rows, live=rows.live & ~empty)


def step(graphdef, params, cache: KVCache, rows: Rows, stop_ids, pad_id, mask_id, run, *,
         forwards: int, method: str, block: int, rule: str, limit: int, unroll: int = 1,
         window: str = "full"):
  """Up to `run` (a run-time int, at most the compiled `forwards`) forwards for every live
  row, so one program serves steps of every length up to `forwards`; a row stops when its
  next window would pass `limit` slots (the pool's, not the span's: the caller makes the
  span hold every slot this step writes; `forwards` and `run` multiples of `unroll`, the
  forwards per test of the loop's condition). Returns (cache, rows, packed): `packed`
  [rows, forwards * max(B, 1) +
  5] int32 holds the new tokens and each row's count, forwards used, liveness, budget and
  write index after the step (`unpack`). One array that is not part of the donated state:
  the host reads it while the next step, already dispatched, consumes the state.

  MARS `window` (decoding/mars.py): "full" reads [B pending | B masks] every forward; "fit"
  reads [w pending | B masks], w the narrowest compiled width holding every live row's
  pending run, one inner while loop per width (unroll must be 1: a width holds for one
  forward at a time), and marks the scratch past each row's index empty after each pass
  over the widths, so a step always ends with none visible to the next one's windows."""
  model = nnx.merge(graphdef, params)
  b = rows.live.shape[0]
  width = max(block, 1)
  out = jnp.full((b, forwards * width), pad_id, jnp.int32)
  count = jnp.zeros((b,), jnp.int32)
  slot = jnp.arange(width)

  run = jnp.minimum(run, forwards)

  def cond(carry):
    _, rows, _, _, n, _ = carry
    return (n < run) & jnp.any(rows.live)

  def ar_body(carry):
    cache, rows, out, count, n, used = carry
    live = rows.live
    ids = rows.pending[:, :1]
    pos = (rows.committed - 1)[:, None]
    logits, cache = model.forward_cached(ids, cache, positions=pos,
                                         segment_ids=jnp.ones_like(ids))
    u = row_uniforms(rows.seed, rows.committed, 1)[:, 0]
    token = sample(logits[:, -1], u, rows.temperature, rows.top_p)
    k = live.astype(jnp.int32)
    cache = dataclasses.replace(cache, index=cache.index - 1 + k)  # a stopped row stays
    return commit(cache, rows, out, count, n, used, token[:, None], k)

  def mars_body(w: int):
    """One forward of the window [pending[:, :w] | B masks]."""
    def body(carry):
      cache, rows, out, count, n, used = carry
      live = rows.live
      ids, pos, seg, need = window_inputs(rows.pending, rows.n_pending, rows.committed,
                                          mask_id, w, block)
      start = cache.index
      logits, cache = model.forward_cached(ids, cache, positions=pos, segment_ids=seg,
                                           logits_at=need)
      cache = dataclasses.replace(cache, index=start + jnp.where(live, rows.n_pending, 0))
      u = row_uniforms(rows.seed, rows.committed, block)
      guess, k = judge_window(logits, rows.tau[:, None], rule, rows.temperature[:, None],
                              rows.top_p[:, None], u)
      return commit(cache, rows, out, count, n, used, guess, jnp.where(live, k, 0))
    return body

  def commit(cache, rows, out, count, n, used, guess, k):
    """Keep the first k guesses of each row, up to its first stop token and its budget;
    the row stops there, or when its next window would not fit the slots."""
    is_stop = jnp.isin(guess, stop_ids) & (slot[None] < k[:, None])
    first_stop = jnp.where(jnp.any(is_stop, axis=1), jnp.argmax(is_stop, axis=1) + 1, width)
    k = jnp.minimum(jnp.minimum(k, first_stop), rows.budget)
    take = slot[None] < k[:, None]
    idx = jnp.where(take, count[:, None] + slot[None], out.shape[1])
    out = out.at[jnp.arange(b)[:, None], idx].set(guess, mode="drop")
    stopped = jnp.any(is_stop & take, axis=1) | (rows.budget - k <= 0)
    # The index is past this forward's kept tokens: the next window is written from it.
    full = cache.index + (1 if method == "ar" else 2 * block) > limit
    rows = dataclasses.replace(rows, pending=jnp.where(take, guess, pad_id),
                               n_pending=jnp.where(k > 0, k, rows.n_pending),
                               committed=rows.committed + k,
                               live=rows.live & ~stopped & ~full, budget=rows.budget - k)
    used = used + (k > 0).astype(jnp.int32)
    return cache, rows, out, count + k, n + 1, used

  widths = pending_widths(block, window) if method == "mars" else (1,)
  if len(widths) > 1 and unroll != 1:
    raise CardjaxError(f"the fit window decodes one forward per test of the step's loop, "
                       f"not unroll={unroll}: use window='full'")
  one = ar_body if method == "ar" else mars_body(widths[-1])

  def body(carry):
    # `unroll` forwards per test of the loop's condition: on a GPU each test is a round
    # trip to the host. A row that stops within them commits nothing in the rest (its
    # live flag gates every commit), so the tokens do not change.
    for _ in range(unroll):
      carry = one(carry)
    return carry

  def need(carry):  # the longest pending run of a live row
    return jnp.max(jnp.where(carry[1].live, carry[1].n_pending, 1))

  cache, rows, out, count, _, used = jax.lax.while_loop(
      cond, body if len(widths) == 1 else width_sweep(widths, cond, need, mars_body, block),
      (cache, rows, out, count, jnp.int32(0), jnp.zeros((b,), jnp.int32)))
  tail = jnp.stack([count, used, rows.live.astype(jnp.int32), rows.budget, cache.index], 1)
  return cache, rows, jnp.concatenate([out, tail.astype(jnp.int32)], axis=1)


def unpack(packed):
  """A step's packed results (numpy, on the host): (out, count, used, live, budget, index)."""
  out, tail = packed[:, :-5], packed[:, -5:]
  return out, tail[:, 0], tail[:, 1], tail[:, 2].astype(bool), tail[:, 3], tail[:, 4]
