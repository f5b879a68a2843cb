"""MARS threshold decoding: tau = 1 is AR greedy; the cached window equals recompute."""

import pytest

from cardjax.decoding import generate
from cardjax.decoding import mars
from cardjax.errors import CardjaxError
from cardjax.model import ModelConfig, create_model

CFG = dict(vocab_size=64, hidden_size=32, intermediate_size=64, num_layers=2, num_heads=4,
           num_kv_heads=2, initializer_range=0.3, mask_token_id=63)
PROMPTS = [[5, 9, 2, 33, 7], [1], [60, 61, 62], [8, 8, 8, 8, 8, 8, 8, 8]]


@pytest.fixture(scope="module", params=[False, True], ids=["list", "scan"])
def model(request):
  return create_model(ModelConfig(**CFG, scan_layers=request.param), seed=1)


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


def test_bad_arguments(model):
  with pytest.raises(CardjaxError, match="tau=1.5 must lie in"):
    mars.generate(model, PROMPTS, 4, block=4, tau=1.5, mask_id=63)
  with pytest.raises(CardjaxError, match="needs the model's \\[MASK\\] id"):
    mars.generate(model, PROMPTS, 4, block=4, tau=0.5, mask_id=-1)
  with pytest.raises(CardjaxError, match="prompt 0 is empty"):
    mars.generate(model, [[]], 4, block=4, tau=0.5, mask_id=63)
