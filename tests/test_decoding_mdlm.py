"""MDLM block decoding: the jitted loop equals a plain-Python reference, a batch equals its
rows, DUS costs exactly log2 B forwards a block."""

import math

import pytest

from cardjax.decoding import mdlm
from cardjax.errors import CardjaxError
from decoding_helpers import PROMPTS, tiny_model

# A random causal-LM config, read bidirectionally: the decoder only needs logits.


@pytest.fixture(scope="module")
def model():
  return tiny_model()


# 10 new tokens in blocks of 4: the last block is cut by the budget.
@pytest.mark.parametrize("kw", [dict(planner="dus", shift=False),
                                dict(planner="dus", shift=True, remask=0.3),
                                dict(planner="confidence", tau=0.1, shift=True)],
                         ids=["dus", "dus_shift_remask", "conf0.1_shift"])
def test_jitted_equals_reference_and_batch_equals_rows(model, kw):
  alone = mdlm.generate(model, [PROMPTS[0]], 10, block=4, **kw)
  want, forwards = mdlm.mdlm_by_recompute(model, PROMPTS[0], 10, block=4, **kw)
  assert alone.rows()[0] == want and alone.forwards == forwards
  batch = mdlm.generate(model, PROMPTS, 10, block=4, **kw)
  for row, prompt in zip(batch.rows(), PROMPTS):
    assert row == mdlm.mdlm_by_recompute(model, prompt, 10, block=4, **kw)[0]
  if kw["planner"] == "confidence":
    assert batch.forwards < 10  # several tokens per forward


@pytest.mark.parametrize("planner", ["dus", "topk"])
def test_dus_costs_log2_block_forwards_per_block(model, planner):
  out = mdlm.generate(model, PROMPTS, 16, block=8, planner=planner)
  assert out.forwards == (16 // 8) * math.ceil(math.log2(8))
  assert (out.lengths == 16).all()


def test_stop_ids_and_step_limit(model):
  full = mdlm.generate(model, PROMPTS, 16, block=8)
  stop = full.rows()[0][5]
  out = mdlm.generate(model, PROMPTS, 16, block=8, stop_ids=[stop])
  for row, whole in zip(out.rows(), full.rows()):
    assert row == (whole[:whole.index(stop) + 1] if stop in whole else whole)
  assert out.lengths[0] <= 6 and (out.tokens[0, out.lengths[0]:] == 0).all()
  one = mdlm.generate(model, PROMPTS, 16, block=8, steps=1)
  assert one.forwards == 2 and (one.lengths == 16).all()


def test_bad_arguments(model):
  with pytest.raises(CardjaxError, match="tau=-0.1 must lie in"):
    mdlm.generate(model, PROMPTS, 4, block=4, tau=-0.1)
  with pytest.raises(CardjaxError, match="block=0 must be"):
    mdlm.generate(model, PROMPTS, 4, block=0)
  with pytest.raises(CardjaxError, match="needs the model's \\[MASK\\] id"):
    mdlm.generate(model, PROMPTS, 4, block=4, mask_id=-1)
  with pytest.raises(CardjaxError, match="max_new_tokens=0 must be"):
    mdlm.generate(model, PROMPTS, 0, block=4)
