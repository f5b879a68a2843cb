"""MARS with the block-level KV cache: equals the no-cache reference (acceptance capped at
B or at the cache block's end), batch equals rows, tau = 1 is AR greedy with one token per
forward; sampling."""

import pytest

from cardjax.decoding import generate
from cardjax.decoding import mars_block
from cardjax.errors import CardjaxError
from decoding_helpers import PROMPTS, tiny_model



@pytest.fixture(scope="module")
def model():
  return tiny_model()


@pytest.mark.parametrize("cache_block,block", [(4, 3), (8, 4)])
def test_block_cache_equals_recompute(model, cache_block, block):
  sizes = []
  for tau in (0.0, 0.3, 0.7):
    batch = mars_block.generate(model, PROMPTS, 10, block=block, cache_block=cache_block,
                                tau=tau, mask_id=63)
    sizes.append(mars_block._generate._cache_size())
    refs = [mars_block.block_by_recompute(model, p, 10, block, cache_block, tau, mask_id=63)
            for p in PROMPTS]
    assert batch.rows() == [tokens for tokens, _ in refs], tau
    # The batch waits for its slowest row at each block, so it needs at least as many.
    assert batch.forwards >= max(f for _, f in refs)
  assert sizes[0] == sizes[-1]  # tau is a runtime value: no recompile


@pytest.mark.parametrize("cache_block,block", [(4, 2), (8, 3)])
def test_cache_block_acceptance_equals_recompute(model, cache_block, block):
  """accept="cache": one fill may accept up to the cache block's end (the reference's
  acceptance window), not just B."""
  sizes = []
  for tau in (0.0, 0.15, 0.3, 0.7):
    kw = dict(block=block, cache_block=cache_block, tau=tau, mask_id=63, accept="cache")
    batch = mars_block.generate(model, PROMPTS, 10, **kw)
    alone = mars_block.generate(model, PROMPTS[:1], 10, **kw)
    sizes.append(mars_block._generate._cache_size())
    refs = [mars_block.block_by_recompute(model, p, 10, **kw) for p in PROMPTS]
    assert batch.rows() == [tokens for tokens, _ in refs], tau
    assert batch.forwards >= max(f for _, f in refs)
    assert alone.rows() == [refs[0][0]] and alone.forwards == refs[0][1]
  assert sizes[0] == sizes[-1]  # tau is a runtime value: no recompile
  # tau 0 fills a cache block's c - 1 masks in one forward: the prefill, then per block a
  # fill and (but for the last block) an extension; capped at B it takes more fills.
  low = dict(block=block, cache_block=cache_block, tau=0.0, mask_id=63)
  n_blocks = -(-10 // cache_block)
  assert mars_block.generate(model, PROMPTS[:1], 10, accept="cache", **low).forwards == (
      1 + n_blocks + n_blocks - 1)
  if cache_block - 1 > block:
    assert mars_block.generate(model, PROMPTS[:1], 10, **low).forwards > 1 + 2 * n_blocks - 1


def test_sampling(model):
  kw = dict(block=3, cache_block=4, tau=0.3, mask_id=63)
  greedy = mars_block.generate(model, PROMPTS, 12, **kw)
  zero = mars_block.generate(model, PROMPTS, 12, temperature=0.0, top_p=0.5, seed=3, **kw)
  assert zero.rows() == greedy.rows() and zero.forwards == greedy.forwards
  top1 = mars_block.generate(model, PROMPTS, 12, temperature=1.0, top_p=1e-6, seed=3, **kw)
  assert top1.rows() == greedy.rows() and top1.forwards == greedy.forwards
  compiled = mars_block._generate._cache_size()
  a = mars_block.generate(model, PROMPTS, 12, temperature=1.0, seed=1, **kw)
  assert mars_block.generate(model, PROMPTS, 12, temperature=1.0, seed=1, **kw).rows() == a.rows()
  assert mars_block.generate(model, PROMPTS, 12, temperature=1.0, seed=2, **kw).rows() != a.rows()
  assert a.rows() != greedy.rows()
  assert mars_block._generate._cache_size() == compiled  # sampling knobs are runtime values


def test_batch_equals_rows_one_by_one(model):
  for tau in (0.0, 0.3):
    batch = mars_block.generate(model, PROMPTS, 10, block=3, cache_block=4, tau=tau,
                                mask_id=63)
    for row, prompt in zip(batch.rows(), PROMPTS):
      alone = mars_block.generate(model, [prompt], 10, block=3, cache_block=4, tau=tau,
                                  mask_id=63)
      want, forwards = mars_block.block_by_recompute(model, prompt, 10, 3, 4, tau, mask_id=63)
      assert alone.rows()[0] == row == want and alone.forwards == forwards


def test_tau_one_is_ar_greedy_one_token_per_forward(model):
  ar = generate(model, PROMPTS, 12).rows()
  out = mars_block.generate(model, PROMPTS, 12, block=4, cache_block=4, tau=1.0, mask_id=63)
  assert out.rows() == ar and out.forwards == 12
  one = mars_block.generate(model, PROMPTS[:1], 12, block=4, cache_block=4, tau=1.0,
                            mask_id=63)
  assert one.rows() == ar[:1] and one.forwards == 12


def test_low_tau_fills_blocks_and_stops(model):
  out = mars_block.generate(model, PROMPTS[:1], 12, block=4, cache_block=4, tau=0.0,
                            mask_id=63)
  # tau 0: the prefill (1 token), then per block one fill of its 3 masks and, but for the
  # last block, one extension (1 token): 1 + (1 + 1) + (1 + 1) + 1 forwards.
  assert out.lengths[0] == 12 and out.forwards == 6
  tokens = out.rows()[0]
  stop = tokens[6]
  first = tokens.index(stop)
  stopped = mars_block.generate(model, PROMPTS[:1], 12, block=4, cache_block=4, tau=0.0,
                                mask_id=63, stop_ids=[stop])
  assert stopped.rows()[0] == tokens[:first + 1]
  assert (stopped.tokens[0, first + 1:] == 0).all()


def test_bad_arguments(model):
  def run(**kw):
    args = dict(max_new_tokens=4, block=4, cache_block=4, tau=0.5, mask_id=63) | kw
    mars_block.generate(model, PROMPTS, **args)

  with pytest.raises(CardjaxError, match="tau=1.5 must lie in"):
    run(tau=1.5)
  with pytest.raises(CardjaxError, match="tau=-0.1 must lie in"):
    run(tau=-0.1)
  with pytest.raises(CardjaxError, match="cache_block=0 must be >= 1"):
    run(cache_block=0)
  with pytest.raises(CardjaxError, match="needs the model's \\[MASK\\] id"):
    run(mask_id=-1)
  with pytest.raises(CardjaxError, match="rule='top3'"):
    run(rule="top3")
  with pytest.raises(CardjaxError, match="max_new_tokens=0 must be >= 1"):
    run(max_new_tokens=0)
  with pytest.raises(CardjaxError, match="accept='all' is not an acceptance window"):
    run(accept="all")
  with pytest.raises(CardjaxError, match="tau=-0.5 must be >= 0 for rule entropy_nats"):
    run(rule="entropy_nats", tau=-0.5)
  with pytest.raises(CardjaxError, match="temperature=-1 must be >= 0"):
    run(temperature=-1)
