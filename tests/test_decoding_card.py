"""CARD block decoding: left_to_right is AR greedy, the cached decoder equals recompute, a
batch equals its rows, DUS costs exactly log2 B forwards a block."""

import math

import pytest

from cardjax.decoding import card, generate
from cardjax.errors import CardjaxError
from decoding_helpers import PROMPTS, tiny_model



@pytest.fixture(scope="module", params=[False, True], ids=["list", "scan"])
def model(request):
  """Both layer layouts, for the invariants that read the KV cache."""
  return tiny_model(request.param)


@pytest.fixture(scope="module")
def list_model():
  """One layout for the rest (each distinct call shape is one more compile)."""
  return tiny_model(False)


def test_left_to_right_is_ar_greedy_token_for_token(model):
  ar = generate(model, PROMPTS, 10).rows()
  out = card.generate(model, PROMPTS, 10, block=4, planner="left_to_right")
  assert out.rows() == ar and out.forwards == 10
  alone = card.generate(model, [PROMPTS[2]], 10, block=4, planner="left_to_right")
  assert alone.rows() == ar[2:3]


# 10 new tokens in blocks of 4: the last block is cut by the budget.
def _check_against_recompute(model, **kw):
  batch = card.generate(model, PROMPTS, 10, block=4, **kw)
  most = 0
  for row, prompt in zip(batch.rows(), PROMPTS):
    want, forwards = card.card_by_recompute(model, prompt, 10, block=4, **kw)
    assert row == want
    most = max(most, forwards)
  assert most <= batch.forwards <= 10  # lockstep: per block the slowest row
  return batch


@pytest.mark.parametrize("kw", [dict(planner="confidence", tau=0.5),
                                dict(planner="dus", remask=0.3)], ids=["conf0.5", "dus"])
def test_cached_equals_recompute(model, kw):
  _check_against_recompute(model, **kw)


@pytest.mark.parametrize("kw", [dict(planner="confidence", tau=0.1),
                                dict(planner="eb", gamma=8.0, spacing=True, g0=2)],
                         ids=["conf0.1", "eb_spaced"])
def test_batch_equals_rows(list_model, kw):
  batch = _check_against_recompute(list_model, **kw)
  if kw["planner"] == "confidence":
    assert batch.forwards < 10  # several tokens per forward
    alone = card.generate(list_model, [PROMPTS[0]], 10, block=4, **kw)
    assert alone.rows() == batch.rows()[:1]


@pytest.mark.parametrize("planner", ["dus", "topk"])
def test_dus_costs_log2_block_forwards_per_block(list_model, planner):
  out = card.generate(list_model, PROMPTS, 16, block=8, planner=planner)
  assert out.forwards == (16 // 8) * math.ceil(math.log2(8))
  assert (out.lengths == 16).all()


def test_step_limit(list_model):
  one = card.generate(list_model, PROMPTS, 10, block=4, tau=1.0, steps=1)
  assert one.forwards == 3 and (one.lengths == 10).all()  # each block filled at once
  two = card.generate(list_model, PROMPTS[:1], 10, block=4, tau=1.0, steps=2)
  want, forwards = card.card_by_recompute(list_model, PROMPTS[0], 10, block=4, tau=1.0,
                                          steps=2)
  assert two.rows()[0] == want and two.forwards == forwards == 6  # 2 + 2 + 2 (2 slots left)


def test_stop_ids_cut_each_row_at_its_first_stop(list_model):
  full = card.generate(list_model, PROMPTS, 16, block=8, planner="dus")
  stop = full.rows()[0][5]
  out = card.generate(list_model, PROMPTS, 16, block=8, planner="dus", stop_ids=[stop])
  for row, whole in zip(out.rows(), full.rows()):
    assert row == (whole[:whole.index(stop) + 1] if stop in whole else whole)
  assert out.lengths[0] <= 6 and (out.tokens[0, out.lengths[0]:] == 0).all()


def test_bad_arguments(list_model):
  model = list_model
  with pytest.raises(CardjaxError, match="tau=1.5 must lie in"):
    card.generate(model, PROMPTS, 4, block=4, tau=1.5)
  with pytest.raises(CardjaxError, match="block=0 must be"):
    card.generate(model, PROMPTS, 4, block=0)
  with pytest.raises(CardjaxError, match="needs the model's \\[MASK\\] id"):
    card.generate(model, PROMPTS, 4, block=4, mask_id=-1)
  with pytest.raises(CardjaxError, match="planner='beam' is unknown"):
    card.generate(model, PROMPTS, 4, block=4, planner="beam")
  with pytest.raises(CardjaxError, match="prompt 0 is empty"):
    card.generate(model, [[]], 4, block=4)
