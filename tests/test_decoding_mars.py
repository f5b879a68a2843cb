"""MARS threshold decoding: tau = 1 is AR greedy; the cached window equals recompute;
the acceptance rules (top prob, entropy, margin)."""

import jax.numpy as jnp
import numpy as np
import pytest

from cardjax.decoding import generate
from cardjax.decoding import mars
from cardjax.errors import CardjaxError
from decoding_helpers import PROMPTS, tiny_model



@pytest.fixture(scope="module", params=[False, True], ids=["list", "scan"])
def model(request):
  return tiny_model(request.param)


def test_tau_one_is_ar_greedy_token_for_token(model):
  ar = generate(model, PROMPTS, 12).rows()
  out = mars.generate(model, PROMPTS, 12, block=4, tau=1.0, mask_id=63)
  assert out.rows() == ar and out.forwards == 12
  assert mars.generate(model, [PROMPTS[0]], 12, block=4, tau=1.0, mask_id=63).rows() == ar[:1]


@pytest.mark.parametrize("tau", [0.0, 0.3, 0.6])
def test_cached_window_equals_recompute_and_batch_equals_rows(model, tau):
  batch = mars.generate(model, PROMPTS, 10, block=3, tau=tau, mask_id=63)
  for row, prompt in zip(batch.rows(), PROMPTS):
    want, _ = mars.mars_by_recompute(model, prompt, 10, block=3, tau=tau, mask_id=63)
    assert row == want
    alone = mars.generate(model, [prompt], 10, block=3, tau=tau, mask_id=63)
    assert alone.rows()[0] == want


def test_low_tau_writes_whole_blocks_and_stops(model):
  out = mars.generate(model, [PROMPTS[0]], 12, block=4, tau=0.0, mask_id=63)
  assert out.forwards == 3 and out.lengths[0] == 12  # 4 tokens per forward
  stop = out.rows()[0][5]
  first = out.rows()[0].index(stop)
  stopped = mars.generate(model, [PROMPTS[0]], 12, block=4, tau=0.0, mask_id=63,
                          stop_ids=[stop])
  assert stopped.rows()[0] == out.rows()[0][:first + 1]
  assert (stopped.tokens[0, first + 1:] == 0).all()


def test_confidence_rules_on_hand_made_rows():
  probs = jnp.asarray([[[0.7, 0.2, 0.1, 0.0], [0.4, 0.35, 0.25, 0.0], [0.25] * 4]])
  np.testing.assert_allclose(mars.confidence(probs, "prob")[0], [0.7, 0.4, 0.25], atol=1e-6)
  np.testing.assert_allclose(mars.confidence(probs, "margin")[0], [0.5, 0.05, 0.0], atol=1e-6)
  h = -(0.7 * np.log(0.7) + 0.2 * np.log(0.2) + 0.1 * np.log(0.1))  # 0 log 0 counts as 0
  np.testing.assert_allclose(mars.confidence(probs, "entropy")[0, :1], [1 - h / np.log(4)],
                             atol=1e-6)
  assert abs(float(mars.confidence(probs, "entropy")[0, 2])) < 1e-6  # uniform: no confidence
  for rule, tau, want in [("prob", 0.4, 2), ("margin", 0.05, 2), ("margin", 0.3, 1),
                          ("entropy", 0.0, 3), ("prob", 0.0, 3)]:
    assert int(mars.accept_count(probs, tau, rule)[0]) == want, (rule, tau)
  one_hot = jnp.eye(4)[None, :3]  # confidence exactly 1 under every rule
  for rule in mars.RULES:
    assert int(mars.accept_count(one_hot, 1.0, rule)[0]) == 1  # tau = 1 is greedy AR
    assert int(mars.accept_count(probs, 0.99, rule)[0]) == 1  # always at least one


@pytest.mark.parametrize("rule,tau", [("entropy", 0.3), ("margin", 0.15)])
def test_rules_cached_equal_recompute(model, rule, tau):
  batch = mars.generate(model, PROMPTS, 10, block=3, tau=tau, mask_id=63, rule=rule)
  refs = [mars.mars_by_recompute(model, p, 10, block=3, tau=tau, mask_id=63, rule=rule)
          for p in PROMPTS]
  assert batch.rows() == [tokens for tokens, _ in refs]
  assert sum(f for _, f in refs) < len(PROMPTS) * 10  # the rule accepted runs of tokens


def test_tau_is_a_runtime_value(model):
  mars.generate(model, PROMPTS, 10, block=3, tau=0.2, mask_id=63)
  compiled = mars._generate._cache_size()
  mars.generate(model, PROMPTS, 10, block=3, tau=0.8, mask_id=63)
  assert mars._generate._cache_size() == compiled


def test_bad_arguments(model):
  with pytest.raises(CardjaxError, match="tau=1.5 must lie in"):
    mars.generate(model, PROMPTS, 4, block=4, tau=1.5, mask_id=63)
  with pytest.raises(CardjaxError, match="needs the model's \\[MASK\\] id"):
    mars.generate(model, PROMPTS, 4, block=4, tau=0.5, mask_id=-1)
  with pytest.raises(CardjaxError, match="prompt 0 is empty"):
    mars.generate(model, [[]], 4, block=4, tau=0.5, mask_id=63)
  with pytest.raises(CardjaxError, match="max_new_tokens=0 must be >= 1"):
    mars.generate(model, PROMPTS, 0, block=4, tau=0.5, mask_id=63)
  with pytest.raises(CardjaxError, match="rule='top3' is not an acceptance rule"):
    mars.generate(model, PROMPTS, 4, block=4, tau=0.5, mask_id=63, rule="top3")
