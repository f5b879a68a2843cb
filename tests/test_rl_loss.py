"""The RL learner's pieces against plain references: group advantages against
hand-computed values, the loss of each aggregation against a loop over tokens, its
gradient against the analytic per-token gradient, and a toy softmax policy's gradient
against finite differences in float64."""

import math

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from cardjax.rl import advantages as adv
from cardjax.rl.loss import policy_loss

REWARDS = np.array([[1, 0, 0, 1], [1, 1, 1, 1], [0, 0, 0, 1]], np.float32)


def test_group_advantages_by_hand():
  third = [-0.25 / math.sqrt(0.1875)] * 3 + [0.75 / math.sqrt(0.1875)]
  np.testing.assert_allclose(adv.grpo(REWARDS), [[1, -1, -1, 1], [0] * 4, third], atol=1e-5)
  np.testing.assert_allclose(adv.dr_grpo(REWARDS),
                             [[.5, -.5, -.5, .5], [0] * 4, [-.25, -.25, -.25, .75]])
  assert adv.informative(REWARDS).tolist() == [True, False, True]


def _inputs(seed=0, rollouts=4, length=6):
  rng = np.random.default_rng(seed)
  new = rng.normal(-2, 0.5, (rollouts, length))
  old = new + rng.normal(0, 0.3, new.shape)  # ratios on both sides of the band
  ref = new + rng.normal(0, 0.2, new.shape)
  a = rng.normal(0, 1, rollouts)
  mask = (rng.random((rollouts, length)) > 0.25).astype(np.float64)
  mask[:, 0] = 1
  return new, old, ref, a, mask


def _reference(new, old, ref, a, mask, aggregation, lo, hi, beta, max_new):
  """The loss as a loop over rollouts and tokens, in Python floats."""
  per_rollout, total, count = [], 0.0, 0
  for i in range(new.shape[0]):
    s, n = 0.0, 0
    for t in range(new.shape[1]):
      if not mask[i, t]:
        continue
      ratio = math.exp(new[i, t] - old[i, t])
      policy = -min(ratio * a[i], min(max(ratio, 1 - lo), 1 + hi) * a[i])
      d = ref[i, t] - new[i, t]
      token = policy + beta * (math.exp(d) - d - 1)
      s, n = s + token, n + 1
    total, count = total + s, count + n
    per_rollout.append(s / n if aggregation == "grpo" else s / max_new)
  return total / count if aggregation == "dapo" else sum(per_rollout) / len(per_rollout)


@pytest.mark.parametrize("aggregation", ["grpo", "dr_grpo", "dapo"])
def test_loss_matches_a_loop_over_tokens(aggregation):
  new, old, ref, a, mask = _inputs()
  kw = dict(aggregation=aggregation, clip_low=0.2, clip_high=0.28, kl_coef=0.05,
            max_new_tokens=8)
  loss, metrics = policy_loss(*(jnp.asarray(x, jnp.float32) for x in (new, old, ref, a, mask)),
                              **kw)
  want = _reference(new, old, ref, a, mask, aggregation, 0.2, 0.28, 0.05, 8)
  np.testing.assert_allclose(float(loss), want, rtol=1e-5)
  assert 0 < float(metrics["clip_fraction"]) < 1 and float(metrics["kl"]) > 0


@pytest.mark.parametrize("aggregation", ["grpo", "dr_grpo", "dapo"])
def test_gradient_matches_the_analytic_one(aggregation):
  new, old, ref, a, mask = _inputs(1)
  lo, hi, beta, max_new = 0.2, 0.28, 0.05, 8
  grad = jax.grad(lambda n: policy_loss(n, *(jnp.asarray(x, jnp.float32)
                                             for x in (old, ref, a, mask)),
                                        aggregation=aggregation, clip_low=lo, clip_high=hi,
                                        kl_coef=beta, max_new_tokens=max_new)[0])(
      jnp.asarray(new, jnp.float32))
  ratio = np.exp(new - old)
  unclipped = ratio * a[:, None]
  clipped = np.clip(ratio, 1 - lo, 1 + hi) * a[:, None]
  # d(-min(u, c))/d new: -u where the unclipped term is the min (c's clip is flat), else 0.
  d_policy = np.where(unclipped <= clipped, -unclipped, 0.0)
  d_kl = 1.0 - np.exp(ref - new)
  per_token = (d_policy + beta * d_kl) * mask
  if aggregation == "grpo":
    want = per_token / mask.sum(-1, keepdims=True) / new.shape[0]
  elif aggregation == "dr_grpo":
    want = per_token / max_new / new.shape[0]
  else:
    want = per_token / mask.sum()
  np.testing.assert_allclose(np.asarray(grad), want, rtol=1e-4, atol=1e-7)


def test_a_toy_softmax_policys_gradient_matches_finite_differences():
  rng = np.random.default_rng(3)
  vocab, rollouts, length = 5, 3, 4
  theta = rng.normal(0, 1, vocab)
  tokens = rng.integers(0, vocab, (rollouts, length))
  old = np.log(np.exp(theta) / np.exp(theta).sum())[tokens] + rng.normal(0, .1, tokens.shape)
  ref = old + rng.normal(0, .1, tokens.shape)
  a, mask = np.array([1.0, -0.5, 0.25]), np.ones((rollouts, length))

  def loss(th, xp):
    logp = th - xp.log(xp.exp(th).sum())
    new = logp[tokens]
    if xp is np:
      return _reference(new, old, ref, a, mask, "dapo", 0.2, 0.2, 0.1, length)
    return policy_loss(new, old, ref, a, mask, aggregation="dapo", kl_coef=0.1)[0]

  with jax.enable_x64(True):
    grad = np.asarray(jax.grad(lambda th: loss(th, jnp))(jnp.asarray(theta)))
  h, numeric = 1e-6, np.zeros(vocab)
  for k in range(vocab):
    up, down = theta.copy(), theta.copy()
    up[k] += h
    down[k] -= h
    numeric[k] = (loss(up, np) - loss(down, np)) / (2 * h)
  np.testing.assert_allclose(grad, numeric, rtol=1e-5, atol=1e-8)
