"""The masked-diffusion RL log-probabilities (one-step and coupled) against a loop that
builds, for each response token, the input its estimate masks and reads that token's
log-softmax from a bidirectional forward of a random-init model."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from cardjax.attention.masks import MaskSpec
from cardjax.model import ModelConfig, create_model
from cardjax.rl.logprobs import coupled_masked_logprobs, one_step_masked_logprobs

MASK = 3


@pytest.fixture(scope="module")
def model():
  return create_model(ModelConfig(vocab_size=40, hidden_size=32, intermediate_size=64,
                                  num_layers=2, num_heads=4, num_kv_heads=2, head_dim=8,
                                  mask_token_id=MASK), seed=2)


def _forward(model):
  return lambda t, p, s: model(t, p, s, mask=MaskSpec("bidirectional"))


def _case():
  rng = np.random.default_rng(1)
  tokens = rng.integers(4, 40, (2, 10)).astype(np.int32)
  response = np.zeros_like(tokens)
  response[0, 5:] = 1
  response[1, 3:8] = 1
  return tokens, response


def _reference(model, inputs_for, tokens, response, shift):
  """For every response token: the input its estimate used, one forward, its log-prob."""
  out = np.zeros(tokens.shape)
  for row in range(tokens.shape[0]):
    for q in np.flatnonzero(response[row]):
      inputs = inputs_for(row, q)[None]
      logits = np.asarray(model(jnp.asarray(inputs), mask=MaskSpec("bidirectional"))[0],
                          np.float32)
      at = q - 1 if shift else q
      out[row, q] = np.asarray(jax.nn.log_softmax(logits[at]))[tokens[row, q]]
  return out


@pytest.mark.parametrize("shift", [False, True])
def test_one_step_estimate(model, shift):
  tokens, response = _case()
  rng = jax.random.key(0)
  got = np.asarray(one_step_masked_logprobs(_forward(model), jnp.asarray(tokens),
                                            jnp.asarray(response), rng, MASK, 0.5,
                                            shift=shift))
  hide = (np.asarray(jax.random.uniform(rng, tokens.shape)) < 0.5) & (response == 0)
  masked = np.where((response > 0) | hide, MASK, tokens)
  assert hide.any()  # some prompt tokens were hidden
  want = _reference(model, lambda row, q: masked[row], tokens, response, shift)
  np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("shift", [False, True])
def test_coupled_estimate_scores_each_token_once_with_the_other_half_visible(model, shift):
  tokens, response = _case()
  rng = jax.random.key(5)
  got = np.asarray(coupled_masked_logprobs(_forward(model), jnp.asarray(tokens),
                                           jnp.asarray(response), rng, MASK, shift=shift))
  first = (np.asarray(jax.random.uniform(rng, tokens.shape)) < 0.5) & (response > 0)
  second = (response > 0) & ~first
  assert first.any() and second.any()

  def inputs_for(row, q):
    hidden = first[row] if first[row, q] else second[row]
    return np.where(hidden, MASK, tokens[row])

  want = _reference(model, inputs_for, tokens, response, shift)
  np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-5)
  assert (got[response == 0] == 0).all() and (got[response > 0] < 0).all()
