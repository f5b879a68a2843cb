"""Block planners: the DUS rounds against a numpy reference, every planner on hand cases."""

import jax.numpy as jnp
import numpy as np
import pytest

from cardjax.decoding import planners
from cardjax.decoding.planners import Planner, dus_levels, make_knobs, reveal, spacing_filter
from cardjax.errors import CardjaxError

T, F = True, False


def levels_reference(block, base):
  """METHODS.md section 3 in numpy: a level id per slot, leftovers last."""
  level = np.full(block, -1)
  stride, r = block // base, 0
  while stride >= 1:
    new = (np.arange(block) % stride == 0) & (level < 0)
    if new.any():
      level[new], r = r, r + 1
    stride //= base
  left = level < 0  # leftovers: a last round, merged into the one before when smaller
  if left.any():
    level[left] = r - 1 if r >= 1 and left.sum() < (level == r - 1).sum() else r
  return [np.flatnonzero(level == i).tolist() for i in range(level.max() + 1)]


def test_dus_levels_examples_and_reference():
  assert dus_levels(8) == [[0, 4], [2, 6], [1, 3, 5, 7]]
  assert dus_levels(32) == [[0, 16], [8, 24], [4, 12, 20, 28], list(range(2, 32, 4)),
                            list(range(1, 32, 2))]
  assert dus_levels(1) == [[0]]
  # Stride rounds are never merged: B = 5 is two rounds, B = 46 and 47 five (issue 16).
  assert dus_levels(5) == [[0, 2, 4], [1, 3]]
  assert len(dus_levels(46)) == len(dus_levels(47)) == 5
  assert dus_levels(2, 3) == [[0, 1]]  # B < base: every slot is a leftover, one round
  for base in (2, 3, 4):
    for block in range(1, 70):
      levels = dus_levels(block, base)
      assert levels == levels_reference(block, base), (block, base)
      assert sorted(sum(levels, [])) == list(range(block))
      assert len(levels) <= max(1, int(np.ceil(np.log(block) / np.log(base) - 1e-9)))
    for power in range(1, 5):
      assert len(dus_levels(base ** power, base)) == power  # ceil(log_a B) forwards


def _knobs(**kw):
  return make_knobs(**{"tau": 0.9, **kw})


def _reveal(kind, conf, masked, rnd=0, entropy=None, block=None, spacing=False, last=False,
            **kw):
  conf = jnp.asarray(conf, jnp.float32)
  entropy = -conf if entropy is None else jnp.asarray(entropy, jnp.float32)
  plan = Planner(kind, block or conf.shape[1], spacing=spacing)
  out = reveal(plan, conf, entropy, jnp.asarray(masked), jnp.int32(rnd), _knobs(**kw), last)
  return np.asarray(out).tolist()


def test_confidence_takes_everything_above_tau_plus_the_best():
  conf = [[0.95, 0.2, 0.99, 0.91], [0.1, 0.2, 0.3, 0.05], [0.9, 0.9, 0.9, 0.9]]
  masked = [[T, T, F, T], [T, T, T, T], [F, F, F, F]]
  want = [[T, F, F, T], [F, F, T, F], [F, F, F, F]]
  assert _reveal("confidence", conf, masked) == want
  assert _reveal("cb", conf, masked) == want
  assert _reveal("confidence", conf, masked, tau=1.0)[0] == [T, F, F, F]


def test_topk_follows_the_dus_round_sizes():
  conf = [[0.1, 0.8, 0.3, 0.9, 0.2, 0.7, 0.6, 0.5]]
  all8 = [[T] * 8]
  assert _reveal("topk", conf, all8, rnd=0) == [[F, T, F, T, F, F, F, F]]  # round of 2
  masked = [[T, F, T, F, T, T, T, T]]
  assert _reveal("topk", conf, masked, rnd=1) == [[F, F, F, F, F, T, T, F]]
  assert _reveal("topk", conf, masked, rnd=2) == masked  # the last round takes all


def test_dus_rounds_remask_and_budget():
  conf = [[0.9, 0.9, 0.9, 0.9, 0.1, 0.9, 0.9, 0.9]]
  all8 = [[T] * 8]
  assert _reveal("dus", conf, all8, rnd=0) == [[T, F, F, F, T, F, F, F]]
  after0 = [[F, T, T, T, F, T, T, T]]
  assert _reveal("dus", conf, after0, rnd=1) == [[F, F, T, F, F, F, T, F]]
  assert _reveal("dus", conf, [[F, T, F, T, F, T, F, T]], rnd=2) == [[F, T, F, T, F, T, F, T]]
  # remask 0.3: slot 4 (p = 0.1) stays masked after round 0 and is due again in round 1.
  assert _reveal("dus", conf, all8, rnd=0, remask=0.3) == [[T, F, F, F, F, F, F, F]]
  left = [[F, T, T, T, T, T, T, T]]
  assert _reveal("dus", conf, left, rnd=1, remask=0.3) == [[F, F, T, F, F, F, T, F]]
  assert _reveal("dus", conf, left, rnd=1, remask=0.05) == [[F, F, T, F, T, F, T, F]]
  assert _reveal("dus", conf, left, rnd=2, remask=0.95) == left  # no remask in the last round
  # Every due slot below remask: the most confident due slot is still revealed.
  low = [[0.1, 0.1, 0.1, 0.1, 0.2, 0.1, 0.1, 0.1]]
  assert _reveal("dus", low, all8, rnd=0, remask=0.3) == [[F, F, F, F, T, F, F, F]]
  # A block cut by the token budget (slots 0-1 only): round 1 has no due slot left, so it
  # takes the most confident masked one.
  assert _reveal("dus", conf, [[F, T, F, F, F, F, F, F]], rnd=1) == [[F, T, F, F, F, F, F, F]]


def test_eb_takes_the_largest_prefix_within_the_entropy_budget():
  entropy = [[0.1, 0.5, 2.0, 0.3, 0.0]]
  masked = [[T, T, T, T, F]]  # slot 4 is not masked: never counted
  conf = [[0.5] * 5]
  # sorted 0.1, 0.3, 0.5, 2.0: sums before each 0, 0.1, 0.4, 0.9
  assert _reveal("eb", conf, masked, entropy=entropy, gamma=0.5) == [[T, T, F, T, F]]
  assert _reveal("eb", conf, masked, entropy=entropy, gamma=0.0) == [[T, F, F, F, F]]
  assert _reveal("eb", conf, masked, entropy=entropy, gamma=5.0) == [[T, T, T, T, F]]


def test_left_to_right_and_the_step_limit():
  conf = [[0.1, 0.9, 0.2, 0.3]]
  assert _reveal("left_to_right", conf, [[F, T, T, F]]) == [[F, T, F, F]]
  for kind in planners.KINDS:
    assert _reveal(kind, conf, [[F, T, T, T]], last=True) == [[F, T, T, T]]


def test_spacing_filter_keeps_far_candidates_in_score_order():
  conf = jnp.asarray([[0.1, 0.2, 0.3, 0.9, 0.8, 0.7, 0.6, 0.5]])
  cand = jnp.ones((1, 8), bool)
  kept = spacing_filter(cand, conf, jnp.asarray([4]))
  assert np.flatnonzero(kept[0]).tolist() == [3, 7]
  kept = spacing_filter(cand, conf, jnp.asarray([2]))
  assert np.flatnonzero(kept[0]).tolist() == [1, 3, 5, 7]
  # Through the planners: gap = max(2, M_rem * g0 // B); 8 masks, g0 = 4 -> gap 4.
  masked = [[T] * 8]
  assert _reveal("confidence", conf, masked, spacing=True, tau=0.0, g0=4) == \
      [[F, F, F, T, F, F, F, T]]
  assert _reveal("cb", conf, masked, spacing=True, tau=0.0, g0=1) == \
      [[F, T, F, T, F, T, F, T]]
  assert _reveal("eb", conf, masked, spacing=True, gamma=100.0, g0=4) == \
      [[F, F, F, T, F, F, F, T]]  # entropy = -conf: the same order


def test_every_planner_reveals_a_masked_slot_per_row_with_masks():
  rng = np.random.default_rng(0)
  conf = rng.uniform(size=(6, 8))
  masked = rng.uniform(size=(6, 8)) < 0.5
  masked[0] = False
  masked[1] = [T] + [F] * 7
  for kind in planners.KINDS:
    for rnd in range(4):
      spaced = kind in planners.SPACED
      out = np.asarray(_reveal(kind, conf, masked, rnd=rnd, entropy=rng.uniform(size=(6, 8)),
                               spacing=spaced, remask=0.5, tau=0.5))
      assert not (out & ~masked).any(), kind
      assert (out.any(axis=1) == masked.any(axis=1)).all(), kind


def test_bad_arguments():
  with pytest.raises(CardjaxError, match="planner='greedy' is unknown"):
    Planner("greedy", 8)
  with pytest.raises(CardjaxError, match="block=0 must be"):
    Planner("dus", 0)
  with pytest.raises(CardjaxError, match="base=1 must be >= 2"):
    Planner("dus", 8, base=1)
  with pytest.raises(CardjaxError, match="spacing=True applies"):
    Planner("dus", 8, spacing=True)
  with pytest.raises(CardjaxError, match="tau=1.5 must lie in"):
    make_knobs(tau=1.5)
  with pytest.raises(CardjaxError, match="gamma=-1"):
    make_knobs(gamma=-1.0)
  with pytest.raises(CardjaxError, match="remask=2"):
    make_knobs(remask=2.0)
  with pytest.raises(CardjaxError, match="steps=0"):
    planners.check_steps(0, 8)


def test_slot_stats_equal_a_numpy_softmax():
  """argmax, top probability and entropy in bits of each slot against numpy's float64
  softmax, peaked and flat rows and a -inf logit among them."""
  from cardjax.decoding.planners import slot_stats

  rng = np.random.default_rng(0)
  logits = rng.normal(size=(3, 4, 50)).astype(np.float32) * np.array([0.1, 3.0, 12.0])[:, None,
                                                                                     None]
  logits[0, 0, 7] = -np.inf
  guess, conf, entropy = (np.asarray(v) for v in slot_stats(jnp.asarray(logits)))
  x = logits.astype(np.float64)
  p = np.exp(x - x.max(-1, keepdims=True))
  p /= p.sum(-1, keepdims=True)
  h = -np.sum(np.where(p > 0, p * np.log(np.where(p > 0, p, 1.0)), 0.0), -1) / np.log(2.0)
  assert (guess == x.argmax(-1)).all()
  np.testing.assert_allclose(conf, p.max(-1), rtol=1e-5)
  np.testing.assert_allclose(entropy, h, rtol=1e-5, atol=1e-5)
