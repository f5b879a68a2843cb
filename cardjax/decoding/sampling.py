"""Greedy or top-p (nucleus) sampling, with a temperature and top_p per row.

The nucleus of a distribution p (at temperature T) is its smallest set of most likely
tokens whose mass reaches top_p: sorted by probability, a token is kept while the mass
before it is < top_p. A token is drawn from the kept ones in proportion to p.

Sorting the vocabulary is how this is usually written, and on a CPU it is the costliest
part of a decode step: a [16, 49152] argsort takes ~200 ms on 2 cores, more than a 16-row
forward of a 135M model. So nothing here sorts the vocabulary:
  - most rows' nuclei lie in their TOP_K most likely tokens (a language model's next-token
    distribution is peaked): those come from `lax.top_k` (~1 ms for 16 rows) and the
    nucleus is read off their running mass;
  - a row whose nucleus reaches past TOP_K (flat distributions, top_p near 1) finds its
    cut by bisection on the float32 bit pattern of the weights (positive floats order as
    their bits, so 31 halvings give the exact cut: the kept set is every weight >= the
    smallest weight the sorted rule keeps), then draws by inverse CDF over the vocabulary
    in two levels (blocks of BLOCK tokens, then one block).
Each row draws with one uniform number u in [0, 1): the token at which the kept mass,
accumulated in the order above, passes u times the kept total. The caller owns u, so a
row's draw depends on its own key only (serve/pool/slots.py keys it by the row's seed and
position: the same request samples the same tokens whatever rows share its step).

Rows at temperature 0 take the argmax; a batch with no sampling row skips all of this.
Exact ties at the nucleus' edge are all kept (a sort would keep an arbitrary subset).
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
from jax import lax

TOP_K = 64  # candidates read by lax.top_k before falling back to the bisection
BLOCK = 256  # tokens per block of the two-level inverse CDF


def _inverse_cdf(weights, target):
  """The first index at which the running sum of `weights` [n, k] exceeds `target` [n]
  (never a zero-weight index: rounding at the end falls back to the last positive one)."""
  cum = jnp.cumsum(weights, axis=-1)
  index = jnp.sum(cum <= target[:, None], axis=-1)
  last = weights.shape[-1] - 1 - jnp.argmax(weights[:, ::-1] > 0, axis=-1)
  return jnp.minimum(index, last)


def _cut_bits(weights, mass):
  """Per row, the float32 bits of the smallest weight the nucleus keeps: the largest t
  with sum(weights >= t) >= mass (bisection over the bit patterns of [0, 1]; positive
  floats order as their bits)."""
  bits = lax.bitcast_convert_type(weights, jnp.int32)
  lo = jnp.zeros(weights.shape[:-1], jnp.int32)  # every weight >= 0: the whole mass
  hi = jnp.full(weights.shape[:-1], 0x3F800001, jnp.int32)  # past 1.0: no weight

  def halve(_, bounds):
    lo, hi = bounds
    mid = lo + (hi - lo) // 2
    ok = jnp.sum(jnp.where(bits >= mid[:, None], weights, 0.0), axis=-1) >= mass
    return jnp.where(ok, mid, lo), jnp.where(ok, hi, mid)

  lo, _ = lax.fori_loop(0, 31, halve, (lo, hi))
  return lo


def _sample_wide(weights, mass, u):
  """Draws for rows whose nucleus is cut by bisection (mass: top_p, or above 1 for no cut)."""
  n, vocab = weights.shape
  bits = lax.bitcast_convert_type(weights, jnp.int32)
  # The bisection only where a row has a cut to find (top_p 1 keeps every token).
  cut = lax.cond(jnp.any(mass <= 1.0), lambda: _cut_bits(weights, jnp.minimum(mass, 1.0)),
                 lambda: jnp.zeros((n,), jnp.int32))
  kept = jnp.where((bits >= cut[:, None]) | (mass[:, None] > 1.0), weights, 0.0)
  blocks = -(-vocab // BLOCK)
  kept_b = jnp.pad(kept, ((0, 0), (0, blocks * BLOCK - vocab))).reshape(n, blocks, BLOCK)
  sums = kept_b.sum(axis=-1)
  target = u * sums.sum(axis=-1)
  block = _inverse_cdf(sums, target)
  before = jnp.cumsum(sums, axis=-1) - sums
  rest = target - jnp.take_along_axis(before, block[:, None], axis=-1)[:, 0]
  inside = jnp.take_along_axis(kept_b, block[:, None, None], axis=1)[:, 0]
  return block * BLOCK + _inverse_cdf(inside, rest)


def _sample(logits, u, temperature, top_p):
  """Nucleus draws for every row of logits [n, vocab] (temperature > 0 assumed)."""
  # Greedy rows (their draw is dropped) at temperature 1: dividing by ~0 would fill them
  # with subnormal weights, which cost a CPU several times a normal float.
  scaled = logits.astype(jnp.float32) / jnp.where(temperature > 0, temperature, 1.0)[:, None]
  weights = jnp.exp(scaled - jnp.max(scaled, axis=-1, keepdims=True))
  weights = weights / jnp.sum(weights, axis=-1, keepdims=True)
  # top_p 1 keeps the whole vocabulary: no cut (mass 2 marks it for _sample_wide).
  mass = jnp.where(top_p >= 1.0, 2.0, top_p)
  k = min(TOP_K, weights.shape[-1])
  top, index = lax.top_k(weights, k)
  keep = (jnp.cumsum(top, axis=-1) - top) < mass[:, None]
  # The nucleus ended inside the top k (a greedy row takes its argmax in `sample`: it
  # must not send the batch down the wide path).
  narrow = ~keep[:, -1] | (temperature <= 0)
  kept = jnp.where(keep, top, 0.0)
  pick = _inverse_cdf(kept, u * kept.sum(axis=-1))
  token = jnp.take_along_axis(index, pick[:, None], axis=-1)[:, 0]
  wide = lax.cond(jnp.any(~narrow), _sample_wide, lambda w, m, u: token, weights, mass, u)
  return jnp.where(narrow, token, wide)


def greedy_only(temperature: float):
  """What a one-shot decoder passes for `temperature`: None at 0, so its program is the
  greedy one with no sampling `cond` or random numbers in its loop (on an accelerator each
  cond's predicate is a trip to the host per forward); the float otherwise. A separate
  compiled program from the sampling one, which takes any temperature > 0 at run time."""
  return None if temperature == 0 else np.float32(temperature)


def sample(logits, u, temperature, top_p):
  """Tokens for logits [..., vocab]: the argmax where temperature is 0, else a nucleus
  draw with the uniform number u in [0, 1). u, temperature and top_p have the leading
  shape of logits (or broadcast to it); temperature None: the argmax, statically."""
  lead = logits.shape[:-1]
  flat = logits.reshape(-1, logits.shape[-1])
  greedy = jnp.argmax(flat, axis=-1).astype(jnp.int32)
  if temperature is None:  # greedy_only(): no cond, no draw in the program at all
    return greedy.reshape(lead)
  t = jnp.broadcast_to(jnp.asarray(temperature, jnp.float32), lead).reshape(-1)
  p = jnp.broadcast_to(jnp.asarray(top_p, jnp.float32), lead).reshape(-1)
  u = jnp.broadcast_to(jnp.asarray(u, jnp.float32), lead).reshape(-1)
  drawn = lax.cond(jnp.any(t > 0), lambda: _sample(flat, u, t, p).astype(jnp.int32),
                   lambda: greedy)
  return jnp.where(t > 0, drawn, greedy).reshape(lead)


def row_uniforms(seeds, positions, width: int):
  """u [rows, width] for the slots a row decodes at `positions` [rows] (its committed
  length): keyed by the row's seed and position only, so a row draws the same numbers
  whatever rows share its step."""
  def one(seed, position):
    key = jax.random.fold_in(jax.random.key(seed), position)
    return jax.random.uniform(key, (width,))
  return jax.vmap(one)(seeds, positions)
