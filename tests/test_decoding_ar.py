"""AR decoding with the KV cache equals AR by recompute; batches equal their rows."""

import jax.numpy as jnp
import numpy as np
import pytest

from cardjax.decoding import generate, greedy_by_recompute, left_pad
from cardjax.errors import CardjaxError
from decoding_helpers import PROMPTS, tiny_model
from cardjax.model.cache import KVCache



@pytest.fixture(scope="module", params=[False, True], ids=["list", "scan"])
def model(request):
  return tiny_model(request.param)


def test_cached_forward_equals_full_forward(model):
  tokens = jnp.asarray(np.random.RandomState(0).randint(0, 64, (3, 11)), jnp.int32)
  cache = KVCache.create(model.cfg, 3, 16)
  pieces = []
  for start, stop in ((0, 5), (5, 6), (6, 11)):
    pos = jnp.broadcast_to(jnp.arange(start, stop), (3, stop - start))
    logits, cache = model.forward_cached(tokens[:, start:stop], cache, positions=pos)
    pieces.append(logits)
  np.testing.assert_allclose(np.concatenate(pieces, 1), model(tokens), atol=1e-5)
  assert int(cache.index) == 11


def test_logits_at_gives_the_chosen_positions_and_the_same_cache(model):
  tokens = jnp.asarray(np.random.RandomState(1).randint(0, 64, (2, 7)), jnp.int32)
  full, cache_full = model.forward_cached(tokens, KVCache.create(model.cfg, 2, 8))
  at = jnp.asarray([[6, 0, 3], [2, 2, 5]], jnp.int32)
  some, cache_some = model.forward_cached(tokens, KVCache.create(model.cfg, 2, 8),
                                          logits_at=at)
  assert some.shape == (2, 3, 64)
  np.testing.assert_allclose(some, np.take_along_axis(np.asarray(full), np.asarray(at)[..., None],
                                                      axis=1), atol=1e-6)
  np.testing.assert_array_equal(cache_some.k, cache_full.k)



def test_greedy_with_cache_equals_recompute_batch_1_and_batched(model):
  expected = [greedy_by_recompute(model, p, 12) for p in PROMPTS]
  for prompt, want in zip(PROMPTS, expected):
    assert generate(model, [prompt], 12).rows()[0] == want
  batch = generate(model, PROMPTS, 12)
  assert batch.rows() == expected  # a batch equals its rows decoded one by one
  assert batch.forwards == 12


def test_stops_at_eos_and_pads(model):
  free = greedy_by_recompute(model, PROMPTS[0], 12)
  stop = free[3]
  out = generate(model, [PROMPTS[0], PROMPTS[2]], 12, stop_ids=[stop], pad_id=0)
  row = out.rows()[0]
  assert row == free[:free.index(stop) + 1]
  assert (out.tokens[0, len(row):] == 0).all()


def test_sampling_is_seeded_and_top_p_tiny_is_greedy(model):
  a = generate(model, PROMPTS, 8, temperature=1.0, seed=3).rows()
  b = generate(model, PROMPTS, 8, temperature=1.0, seed=3).rows()
  c = generate(model, PROMPTS, 8, temperature=1.0, seed=4).rows()
  assert a == b and a != c
  greedy = generate(model, PROMPTS, 8).rows()
  assert generate(model, PROMPTS, 8, temperature=1.0, top_p=1e-6).rows() == greedy


def test_no_new_tokens_is_an_error():
  with pytest.raises(CardjaxError, match="max_new_tokens=0 must be >= 1"):
    generate(tiny_model(), PROMPTS, 0)


def test_bad_prompts():
  with pytest.raises(CardjaxError, match="prompt 1 is empty"):
    left_pad([[1, 2], []], 0)
  with pytest.raises(CardjaxError, match="more than the model's context"):
    left_pad([[1] * 10], 0, max_context=8)


def test_the_prompt_bucket_is_a_parameter_and_changes_no_token():
  """Prompts are padded to a multiple of `bucket` (default prompts.BUCKET, which nobody
  assigns: the server passes its --width-bucket); the padding is invisible."""
  from cardjax.decoding import prompts

  assert left_pad([[1, 2, 3]], 0)[0].shape == (1, prompts.BUCKET)
  tokens, positions, segments, _ = left_pad([[1, 2, 3]], 0, bucket=4)
  assert tokens.shape == (1, 4) and segments.tolist() == [[0, 1, 1, 1]]
  assert positions.tolist() == [[0, 0, 1, 2]]
  model = tiny_model()
  assert generate(model, PROMPTS, 6, bucket=40).rows() == generate(model, PROMPTS, 6).rows()
