"""What one decoding forward costs against the KV cache, by its width: the time a method's
tokens per forward buys against. A method that writes t tokens per forward of w tokens
gains t / (cost of w tokens / cost of 1) over AR on the same machine; on a CPU a forward
costs about its tokens, on an accelerator a small-batch forward costs about the weights it
reads, whatever its width.

`forward_ms` times a jitted loop of forwards (no dispatch or host sync per forward), the
best of a few runs (`best_seconds`); benchmarks/forward_cost.py, decode_forward.py and
decode_overhead.py and the demo price their forwards with it.
"""

from __future__ import annotations

import dataclasses
import time

MOVES = 4  # a moving loop's forwards start at context, context + 1, ... context + MOVES - 1


def forward_ms(graphdef, state, batch: int, tokens: int, slots: int, context: int,
               forwards: int, repeats: int) -> float:
  """ms per cached forward of `tokens` new tokens per row after `context` cached, in a cache
  of `slots`: the best of `repeats` timings of a jitted loop of `forwards` forwards, after
  a first run that compiles it."""
  run = forward_loop(graphdef, state, batch, tokens, slots, context, forwards)
  return best_seconds(run, repeats) / forwards * 1e3


def forward_loop(graphdef, state, batch: int, tokens: int, slots: int, context: int,
                 forwards: int, moving: bool = False):
  """A call that runs the jitted loop of `forwards` cached forwards forward_ms times (one
  program: timing it again, as a benchmark's later rounds do, compiles nothing).

  moving: the cache index and positions change from forward to forward (context + i mod
  MOVES), as a decoder's do, so that XLA cannot fold the rotary factors, the cache write
  offset or the validity mask into constants; off, every forward reads and writes the same
  slots at the same positions."""
  import jax
  import jax.numpy as jnp
  from flax import nnx

  from cardjax.model.cache import KVCache

  reach = context + tokens + (MOVES - 1 if moving else 0)
  if reach > slots:
    raise ValueError(f"{slots} cache slots cannot hold {context} cached + {tokens} new tokens"
                     + (f" moved by up to {MOVES - 1}" if moving else ""))

  @jax.jit
  def loop(state):
    model = nnx.merge(graphdef, state)
    cache = KVCache.create(model.cfg, batch, slots)
    pos = jnp.broadcast_to(context + jnp.arange(tokens), (batch, tokens))
    seg = jnp.ones((batch, tokens), jnp.int32)

    def body(i, carry):
      cache, acc = carry
      shift = (i % MOVES).astype(jnp.int32) if moving else jnp.int32(0)
      cache = dataclasses.replace(cache, index=context + shift)
      tok = jnp.full((batch, tokens), 7, jnp.int32) + i % 3
      logits, cache = model.forward_cached(tok, cache, positions=pos + shift,
                                           segment_ids=seg)
      return cache, acc + logits[:, -1, 0].astype(jnp.float32).sum()

    return jax.lax.fori_loop(0, forwards, body, (cache, jnp.float32(0)))[1]

  return lambda: loop(state)


def best_seconds(run, repeats: int) -> float:
  """The fastest of `repeats` timed calls of run() (a jitted program: its result is waited
  for), after a first call that compiles and warms it."""
  import jax

  jax.block_until_ready(run())
  best = float("inf")
  for _ in range(repeats):
    start = time.perf_counter()
    jax.block_until_ready(run())
    best = min(best, time.perf_counter() - start)
  return best
