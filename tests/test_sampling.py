"""sampling.py against a plain numpy rendering of top-p sampling: the kept set is the
sort-based nucleus, and a grid of u values lands on each kept token in proportion to its
probability, on both paths (nucleus inside the top k, and the bisection past it)."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from cardjax.decoding import sampling


def nucleus(logits, temperature, top_p):
  """The reference: probabilities renormalized over the sort-based nucleus."""
  z = logits.astype(np.float64) / temperature
  p = np.exp(z - z.max())
  p /= p.sum()
  order = np.argsort(-p, kind="stable")
  before = np.cumsum(p[order]) - p[order]
  keep = np.zeros_like(p, bool)
  keep[order] = before < top_p
  q = np.where(keep, p, 0.0)
  return q / q.sum()


def draw_grid(logits, temperature, top_p, n=4000):
  """Tokens for u = (i + 0.5) / n, i < n: their frequencies are the sampled distribution."""
  rows = np.repeat(logits[None], n, 0)
  u = (np.arange(n) + 0.5) / n
  out = jax.jit(sampling.sample)(jnp.asarray(rows), jnp.asarray(u, jnp.float32),
                                 jnp.full((n,), temperature), jnp.full((n,), top_p))
  return np.bincount(np.asarray(out), minlength=logits.shape[-1]) / n


@pytest.mark.parametrize("scale,top_p", [(6.0, 0.9), (6.0, 1.0), (0.5, 0.9), (0.5, 0.3),
                                         (0.5, 1.0)])
def test_draws_follow_the_nucleus(scale, top_p):
  # scale 6: peaked (the nucleus lies in the top k); 0.5 over 3000 tokens: flat (bisection).
  logits = np.random.default_rng(0).normal(size=3000).astype(np.float32) * scale
  ref = nucleus(logits, 0.8, top_p)
  got = draw_grid(logits, 0.8, top_p)
  assert set(np.flatnonzero(got)) <= set(np.flatnonzero(ref))
  # Each token's share of a 4000-point grid is within a grid step of its probability
  # (a token's u-interval has exact length p; rounding moves its edges by < 1/n each).
  assert np.abs(got - ref).max() <= 2 / 4000 + 1e-6
  assert (ref > 0).sum() > (64 if scale < 1 else 1)  # the flat cases do pass the top k


def test_greedy_rows_and_sampled_rows_share_a_call():
  logits = jax.random.normal(jax.random.key(1), (4, 2, 500)) * 3
  t = jnp.asarray([[0.0, 0.0], [1.0, 1.0], [0.0, 0.0], [0.7, 0.7]])
  out = np.asarray(sampling.sample(logits, jnp.full((4, 2), 0.3), t, 0.9))
  greedy = np.asarray(jnp.argmax(logits, -1))
  assert (out[[0, 2]] == greedy[[0, 2]]).all()
  # top_p tiny: the nucleus is the argmax, so a sampled row is greedy too.
  assert (np.asarray(sampling.sample(logits, 0.3, 1.0, 1e-6)) == greedy).all()


def test_row_uniforms_depend_on_seed_and_position_only():
  a = sampling.row_uniforms(jnp.asarray([5, 6], jnp.uint32), jnp.asarray([10, 10]), 3)
  b = sampling.row_uniforms(jnp.asarray([7, 5], jnp.uint32), jnp.asarray([1, 10]), 3)
  assert np.array_equal(a[0], b[1]) and not np.array_equal(a[0], a[1])
  assert (np.asarray(a) >= 0).all() and (np.asarray(a) < 1).all()
