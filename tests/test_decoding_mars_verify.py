"""Self-verified MARS: AR greedy token for token, and up to B + 1 tokens per forward when
the drafts are right; the narrow window ([p | masks] when no row has drafts) changes
nothing but the cost."""

import dataclasses

import jax.numpy as jnp
import numpy as np
import pytest

from cardjax.decoding import generate
from cardjax.decoding import mars_verify
from cardjax.errors import CardjaxError
from cardjax.model import create_model
from decoding_helpers import CONFIG, PROMPTS, tiny_model



@pytest.fixture(scope="module", params=[False, True], ids=["list", "scan"])
def model(request):
  return tiny_model(request.param)


def test_accept_drafts_arithmetic():
  greedy = jnp.asarray([[4, 5, 6, 7], [4, 5, 6, 7], [4, 5, 6, 7], [4, 5, 6, 7]])
  drafts = jnp.asarray([[4, 5, 6], [4, 9, 6], [1, 5, 6], [4, 5, 6]])
  n_drafts = jnp.asarray([3, 3, 3, 0])
  commit, all_kept = mars_verify.accept_drafts(drafts, n_drafts, greedy)
  # all kept + bonus; first mismatch at 1; at 0 (a later match does not count); no drafts.
  np.testing.assert_array_equal(commit, [4, 2, 1, 1])
  np.testing.assert_array_equal(all_kept, [True, False, False, True])


@pytest.mark.parametrize("block", [2, 4, 8])
def test_equals_ar_greedy_token_for_token(model, block):
  ar = generate(model, PROMPTS, 16).rows()
  out = mars_verify.generate(model, PROMPTS, 16, block=block, mask_id=63)
  assert out.rows() == ar and out.forwards <= max(out.lengths)
  full = mars_verify.generate(model, PROMPTS, 16, block=block, mask_id=63, window="full")
  assert full.rows() == ar and full.forwards == out.forwards


def test_batch_of_one(model):
  ar = generate(model, PROMPTS, 16).rows()  # batch equals rows for AR (its own tests)
  for window in ("fit", "full"):
    one = mars_verify.generate(model, PROMPTS[:1], 16, block=4, mask_id=63, window=window)
    assert one.rows() == ar[:1] and one.forwards <= one.lengths[0]


def test_stop_ids(model):
  ar = generate(model, PROMPTS, 16).rows()
  stop = ar[0][6]
  want = generate(model, PROMPTS, 16, stop_ids=[stop])
  out = mars_verify.generate(model, PROMPTS, 16, block=4, mask_id=63, stop_ids=[stop])
  assert out.rows() == want.rows() and out.rows()[0] == ar[0][:ar[0].index(stop) + 1]
  assert (out.tokens[0, out.lengths[0]:] == 0).all()


def test_right_drafts_give_block_plus_one_tokens_per_forward():
  # Every embedding row equal: every position's input is the same and attention averages
  # identical values, so every output is the same and every mask draft is right.
  cfg = dataclasses.replace(CONFIG, tie_word_embeddings=False)
  model = create_model(cfg, seed=2)
  model.embed[...] = jnp.broadcast_to(model.embed[...][:1], model.embed[...].shape)
  block, n = 3, 1 + 2 * (3 + 1)
  token = int(jnp.argmax(model(jnp.asarray([PROMPTS[0]]))[0, -1]))  # greedy AR: token, ...
  # 1 token (no drafts yet: the narrow window), then block drafts + the bonus token per
  # forward (the wide one).
  for window in ("fit", "full"):
    out = mars_verify.generate(model, PROMPTS[:2], n, block=block, mask_id=63, window=window)
    assert out.rows() == [[token] * n] * 2 and out.forwards == 3


def test_bad_arguments(model):
  with pytest.raises(CardjaxError, match="block=0 must be >= 1"):
    mars_verify.generate(model, PROMPTS, 4, block=0, mask_id=63)
  with pytest.raises(CardjaxError, match="needs the model's \\[MASK\\] id"):
    mars_verify.generate(model, PROMPTS, 4, block=4, mask_id=-1)
  with pytest.raises(CardjaxError, match="max_new_tokens=0 must be >= 1"):
    mars_verify.generate(model, PROMPTS, 0, block=4, mask_id=63)
  with pytest.raises(CardjaxError, match="window='wide' is not a window width"):
    mars_verify.generate(model, PROMPTS, 4, block=4, mask_id=63, window="wide")
