"""AR-order rollout log-probabilities against an independent loop: one forward per prefix
of a random-init model, the next token's log-softmax read off the last position."""

import jax
import numpy as np

from cardjax.model import ModelConfig, create_model
from cardjax.rl.logprobs import ar_token_logprobs


def test_ar_logprobs_equal_a_forward_per_prefix():
  model = create_model(ModelConfig(vocab_size=50, hidden_size=32, intermediate_size=64,
                                   num_layers=2, num_heads=4, num_kv_heads=2, head_dim=8),
                       seed=1)
  rng = np.random.default_rng(0)
  tokens = rng.integers(0, 50, (2, 9)).astype(np.int32)
  response = np.zeros_like(tokens)
  response[0, 4:] = 1  # prompt of 4, response of 5
  response[1, 6:8] = 1  # a response then padding
  logp, valid = ar_token_logprobs(lambda t, p, s: model(t, p, s), tokens, response)
  logp, valid = np.asarray(logp), np.asarray(valid)
  for row in range(2):
    for q in range(tokens.shape[1] - 1):
      if not response[row, q + 1]:
        assert not valid[row, q] and logp[row, q] == 0
        continue
      prefix = tokens[row:row + 1, :q + 1]
      last = np.asarray(jax.nn.log_softmax(model(prefix)[0, -1].astype(np.float32)))
      np.testing.assert_allclose(logp[row, q], last[tokens[row, q + 1]], rtol=1e-5,
                                 atol=1e-5)
  assert valid.sum() == response[:, 1:].sum()
