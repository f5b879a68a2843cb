"""MARS threshold decoding: tau = 1 is AR greedy; the cached window equals recompute, and
the pending-sized windows ("fit") equal the 2B one; the acceptance rules (top prob,
entropy, margin, entropy in nats); sampling."""

import math

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


@pytest.mark.parametrize("window", mars.WINDOWS)
def test_tau_one_is_ar_greedy_token_for_token(model, window):
  ar = generate(model, PROMPTS, 12).rows()
  out = mars.generate(model, PROMPTS, 12, block=4, tau=1.0, mask_id=63, window=window)
  assert out.rows() == ar and out.forwards == 12
  one = mars.generate(model, [PROMPTS[0]], 12, block=4, tau=1.0, mask_id=63, window=window)
  assert one.rows() == ar[:1]


@pytest.mark.parametrize("tau", [0.0, 0.15, 0.3, 0.6])
def test_cached_window_equals_recompute_and_batch_equals_rows(model, tau):
  batch = mars.generate(model, PROMPTS, 10, block=3, tau=tau, mask_id=63)
  for row, prompt in zip(batch.rows(), PROMPTS):
    want, _ = mars.mars_by_recompute(model, prompt, 10, block=3, tau=tau, mask_id=63)
    assert row == want
    alone = mars.generate(model, [prompt], 10, block=3, tau=tau, mask_id=63)
    assert alone.rows()[0] == want


def test_pending_widths():
  assert mars.pending_widths(1, "fit") == (1,)
  assert mars.pending_widths(3, "fit") == (1, 2, 3)
  assert mars.pending_widths(4, "fit") == (1, 2, 4)
  assert mars.pending_widths(6, "fit") == (1, 2, 4, 6)
  assert mars.pending_widths(8, "fit") == (1, 2, 4, 8)
  assert mars.pending_widths(8, "full") == (8,)
  with pytest.raises(CardjaxError, match="window='wide' is not a window width"):
    mars.pending_widths(4, "wide")


FIT_CASES = [("prob", 0.0), ("prob", 0.15), ("prob", 0.2), ("prob", 0.3), ("prob", 0.6),
             ("prob", 1.0), ("entropy", 0.3), ("margin", 0.05), ("entropy_nats", 2.9)]


def test_fit_windows_equal_the_full_window(model):
  """Every compiled width gives the 2B window's tokens and forwards (and the no-cache
  reference's), batch and single rows; the schedules below need every width of B = 4.
  Scanned layers run the "prob" cases only (each rule is a compile, slow under scan)."""
  used = set()
  scan = model.cfg.scan_layers
  for rule, tau in [(r, t) for r, t in FIT_CASES if r == "prob" or not scan]:
    kw = dict(block=4, tau=tau, mask_id=63, rule=rule)
    fit = mars.generate(model, PROMPTS, 12, **kw)
    full = mars.generate(model, PROMPTS, 12, window="full", **kw)
    assert fit.rows() == full.rows() and fit.forwards == full.forwards, (rule, tau)
    runs = []
    for row, prompt in zip(fit.rows(), PROMPTS):
      runs.append([1])  # the first window's pending run: the prompt's last token
      want, forwards = mars.mars_by_recompute(model, prompt, 12, runs=runs[-1], **kw)
      assert row == want, (rule, tau)
      if rule == "prob":  # single rows: every rule runs at batch 4 above
        alone = mars.generate(model, [prompt], 12, **kw)
        assert alone.rows()[0] == want and alone.forwards == forwards
    assert fit.forwards == max(len(r) - 1 for r in runs)
    # The batch's window at forward j holds every live row's pending run.
    for j in range(fit.forwards):
      need = max(r[j] for r in runs if j < len(r) - 1)
      used.add(next(w for w in mars.pending_widths(4, "fit") if w >= need))
  assert used == {1, 2, 4}


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
  # "prob" of chosen (e.g. sampled) tokens: the model's probability of each.
  np.testing.assert_allclose(mars.confidence(probs, "prob", jnp.asarray([[1, 2, 0]]))[0],
                             [0.2, 0.25, 0.25], atol=1e-6)
  assert int(mars.accept_count(probs, 0.3, "prob", jnp.asarray([[0, 1, 0]]))[0]) == 2
  assert int(mars.accept_count(probs, 0.3, "prob", jnp.asarray([[1, 0, 0]]))[0]) == 1
  for rule, tau, want in [("prob", 0.4, 2), ("margin", 0.05, 2), ("margin", 0.3, 1),
                          ("entropy", 0.0, 3), ("prob", 0.0, 3)]:
    assert int(mars.accept_count(probs, tau, rule)[0]) == want, (rule, tau)
  one_hot = jnp.eye(4)[None, :3]  # confidence exactly 1 under every rule, entropy 0
  for rule in mars.UNIT_RULES:
    assert int(mars.accept_count(one_hot, 1.0, rule)[0]) == 1  # tau = 1 is greedy AR
    assert int(mars.accept_count(probs, 0.99, rule)[0]) == 1  # always at least one
  assert int(mars.accept_count(one_hot, 0.0, "entropy_nats")[0]) == 1  # T = 0: greedy AR
  assert int(mars.accept_count(one_hot, 1e-6, "entropy_nats")[0]) == 3


def test_entropy_nats_acceptance_count_against_numpy():
  rng = np.random.default_rng(0)
  logits = rng.normal(size=(64, 6, 16)) * rng.uniform(0.5, 6, size=(64, 6, 1))
  probs = np.exp(logits) / np.exp(logits).sum(-1, keepdims=True)
  h = -(probs * np.log(probs)).sum(-1)
  seen = set()
  for t in (0.0, 0.25, 0.35, 0.45, 1.0, 2.0, 3.0):
    ok = (h <= t) & (t > 0)
    want = np.maximum(1, np.cumprod(ok, axis=1).sum(axis=1))
    got = mars.accept_count(jnp.asarray(probs, jnp.float32), t, "entropy_nats")
    np.testing.assert_array_equal(np.asarray(got), want, err_msg=f"T={t}")
    seen.update(want.tolist())
  assert seen == {1, 2, 3, 4, 5, 6}  # the cases cover every run length


@pytest.mark.parametrize("nats", [0.0, 3.1, 3.3])
def test_entropy_nats_equals_normalised_entropy(model, nats):
  """H <= T nats is 1 - H / ln V >= 1 - T / ln V: the same tokens and forwards (T = 0 is
  tau = 1, greedy AR)."""
  tau = 1.0 - nats / math.log(64)
  by_nats = mars.generate(model, PROMPTS, 12, block=4, tau=nats, mask_id=63,
                          rule="entropy_nats")
  by_entropy = mars.generate(model, PROMPTS, 12, block=4, tau=tau, mask_id=63, rule="entropy")
  assert by_nats.rows() == by_entropy.rows() and by_nats.forwards == by_entropy.forwards
  if nats == 0.0:
    assert by_nats.rows() == generate(model, PROMPTS, 12).rows() and by_nats.forwards == 12
  else:
    assert by_nats.forwards < 12  # runs of several tokens were accepted


@pytest.mark.parametrize("rule,tau", [("entropy", 0.3), ("margin", 0.15),
                                      ("entropy_nats", 3.3)])
def test_rules_cached_equal_recompute(model, rule, tau):
  batch = mars.generate(model, PROMPTS, 12, block=4, tau=tau, mask_id=63, rule=rule)
  refs = [mars.mars_by_recompute(model, p, 12, block=4, tau=tau, mask_id=63, rule=rule)
          for p in PROMPTS]
  assert batch.rows() == [tokens for tokens, _ in refs]
  assert sum(f for _, f in refs) < len(PROMPTS) * 12  # the rule accepted runs of tokens


def test_tau_and_sampling_are_runtime_values(model):
  mars.generate(model, PROMPTS, 10, block=3, tau=0.2, mask_id=63)
  compiled = mars._generate._cache_size()
  mars.generate(model, PROMPTS, 10, block=3, tau=0.8, mask_id=63)
  assert mars._generate._cache_size() == compiled
  # Greedy decoding is its own program (no sampling cond or draws in its loop); sampling
  # is one more, whatever its temperature, top_p, seed and tau.
  mars.generate(model, PROMPTS, 10, block=3, tau=0.5, mask_id=63, temperature=0.7,
                top_p=0.9, seed=4)
  mars.generate(model, PROMPTS, 10, block=3, tau=0.3, mask_id=63, temperature=1.3,
                top_p=0.5, seed=5)
  assert mars._generate._cache_size() == compiled + 1


def test_sampling(model):
  greedy = mars.generate(model, PROMPTS, 12, block=4, tau=0.3, mask_id=63)
  # Temperature 0 is the greedy decoder whatever top_p and seed say.
  zero = mars.generate(model, PROMPTS, 12, block=4, tau=0.3, mask_id=63, top_p=0.5, seed=3)
  assert zero.rows() == greedy.rows() and zero.forwards == greedy.forwards
  # A nucleus of one token samples the top token, judged by its probability: greedy again.
  top1 = mars.generate(model, PROMPTS, 12, block=4, tau=0.3, mask_id=63, temperature=1.0,
                       top_p=1e-6, seed=3)
  assert top1.rows() == greedy.rows() and top1.forwards == greedy.forwards
  hot = dict(block=4, tau=0.3, mask_id=63, temperature=1.0)
  a = mars.generate(model, PROMPTS, 12, seed=1, **hot)
  assert mars.generate(model, PROMPTS, 12, seed=1, **hot).rows() == a.rows()
  assert mars.generate(model, PROMPTS, 12, seed=2, **hot).rows() != a.rows()
  assert a.rows() != greedy.rows()
  assert mars.generate(model, PROMPTS, 12, seed=1, window="full", **hot).rows() == a.rows()


def test_bad_arguments(model):
  with pytest.raises(CardjaxError, match="tau=1.5 must lie in"):
    mars.generate(model, PROMPTS, 4, block=4, tau=1.5, mask_id=63)
  with pytest.raises(CardjaxError, match="tau=-0.1 must be >= 0 for rule entropy_nats"):
    mars.generate(model, PROMPTS, 4, block=4, tau=-0.1, mask_id=63, rule="entropy_nats")
  with pytest.raises(CardjaxError, match="needs the model's \\[MASK\\] id"):
    mars.generate(model, PROMPTS, 4, block=4, tau=0.5, mask_id=-1)
  with pytest.raises(CardjaxError, match="prompt 0 is empty"):
    mars.generate(model, [[]], 4, block=4, tau=0.5, mask_id=63)
  with pytest.raises(CardjaxError, match="max_new_tokens=0 must be >= 1"):
    mars.generate(model, PROMPTS, 0, block=4, tau=0.5, mask_id=63)
  with pytest.raises(CardjaxError, match="rule='top3' is not an acceptance rule"):
    mars.generate(model, PROMPTS, 4, block=4, tau=0.5, mask_id=63, rule="top3")
  with pytest.raises(CardjaxError, match="window='wide' is not a window width"):
    mars.generate(model, PROMPTS, 4, block=4, tau=0.5, mask_id=63, window="wide")
  with pytest.raises(CardjaxError, match="temperature=-1.0 must be >= 0"):
    mars.generate(model, PROMPTS, 4, block=4, tau=0.5, mask_id=63, temperature=-1.0)
  with pytest.raises(CardjaxError, match="top_p=0.0 must lie in \\(0, 1\\]"):
    mars.generate(model, PROMPTS, 4, block=4, tau=0.5, mask_id=63, top_p=0.0)
