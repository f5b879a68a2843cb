"""What every objective must do: jit, determinism per row, normalizer, clear errors."""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from objectives_helpers import V, objective, make_batch, jitted, random_logits
from cardjax.config import base_config
from cardjax.errors import ConfigError
from cardjax.model import ModelConfig
from cardjax.objectives import OBJECTIVES, make_objective
from cardjax.objectives.base import ModelInputs


# === all objectives ==========================================================================

ALL = [("card", {}), ("card", {"card_masking": "uniform"}), ("mars", {}), ("mdlm", {}),
       ("mdlm", {"shift": True}), ("bd3lm", {}), ("bd3lm", {"shift": True})]


@pytest.mark.parametrize("name,fields,match", [
    ("card", {"card_masking": "tail"}, "card_masking"),
    ("card", {"card_reweighting": "inverse"}, "card_reweighting"),
    ("card", {"card_lambda": 0.5}, "card_lambda"),
    ("card", {"card_beta": 0.0}, "card_beta"),
    ("card", {"card_p": 1.5}, "card_p"),
    ("card", {"clean_fraction": 2.0}, "clean_fraction"),
    ("mars", {"block_size": 0}, "block_size"),
    ("mars", {"alpha": -1.0}, "alpha"),
    ("bd3lm", {"block_size": 0}, "block_size"),
    ("mdlm", {"t_eps": 1.0}, "t_eps"),
    ("bd3lm", {"t_eps": -0.1}, "t_eps"),
])
def test_bad_config_values(name, fields, match):
  with pytest.raises(ConfigError, match=match):
    objective(name, **fields)


@pytest.mark.parametrize("name", ["card", "mars", "mdlm", "bd3lm"])
@pytest.mark.parametrize("mask_id", [-1, V])
def test_mask_token_id_required(name, mask_id):
  cfg = base_config().objective
  cfg.name = name
  model_cfg = ModelConfig(vocab_size=V, hidden_size=32, intermediate_size=64, num_layers=2,
                          num_heads=4, num_kv_heads=2, mask_token_id=mask_id)
  with pytest.raises(ConfigError, match="mask_token_id"):
    make_objective(cfg, model_cfg)


@pytest.mark.parametrize("name,fields", ALL)
def test_jit_determinism_per_row_and_normalizer(name, fields):
  """Under jit, as the trainer runs it: each row corrupted with its own key (vmapped over
  single-row batches), then the loss. Same keys give the same result, other keys another
  one (MARS has no randomness); the vmapped rows equal single-row calls; and
  loss(batch) * normalizer(batch) = the sum over rows of the same for that row alone, so
  weighting micro-batches by the normalizer reproduces the large batch."""
  obj = objective(name, **fields)
  assert OBJECTIVES[name] is type(obj) and obj.name == name
  rows = [[(0, 16)], [(3, 13)], [(0, 7), (0, 9)], [], [(2, 6)]]
  batch = make_batch(rows, 16)

  def keys(seed):
    return jax.vmap(lambda r: jax.random.fold_in(jax.random.key(seed), r))(
        jnp.arange(len(rows)))

  def one(row, key):
    out = obj.corrupt({k: v[None] for k, v in row.items()}, key)
    return jax.tree.map(lambda x: x[0], out)

  @jax.jit
  def step(batch, keys):
    inputs = jax.vmap(one)(batch, keys)
    logits = random_logits(inputs.tokens.shape, seed=4)
    return inputs, obj.loss(logits, inputs), obj.normalizer(inputs)

  a_in, (a_loss, a_metrics), a_norm = step(batch, keys(0))
  b_in, (b_loss, _), _ = step(batch, keys(0))
  c_in, (c_loss, _), _ = step(batch, keys(1))
  assert isinstance(a_in, ModelInputs)
  assert a_in.tokens.shape == (len(rows), 16 * obj.stream_factor)
  assert np.isfinite(float(a_loss)) and float(a_metrics[f"loss/{name}"]) == float(a_loss)
  for x, y in zip(jax.tree.leaves(a_in), jax.tree.leaves(b_in)):
    np.testing.assert_array_equal(np.asarray(x), np.asarray(y))
  assert float(a_loss) == float(b_loss)
  if name == "mars":  # no randomness by design
    np.testing.assert_array_equal(np.asarray(a_in.tokens), np.asarray(c_in.tokens))
  else:
    assert not np.array_equal(np.asarray(a_in.tokens), np.asarray(c_in.tokens))
    assert float(a_loss) != float(c_loss)

  corrupt, loss_fn = jitted(obj)
  logits = random_logits(a_in.tokens.shape, seed=4)
  total = 0.0
  for r, key in enumerate(keys(0)):
    row_in = corrupt({k: v[r:r + 1] for k, v in batch.items()}, key)
    for x, y in zip(jax.tree.leaves(row_in), jax.tree.leaves(a_in)):
      np.testing.assert_allclose(np.asarray(x)[0], np.asarray(y)[r], rtol=1e-6)
    row_loss, _ = loss_fn(logits[r:r + 1], row_in)
    total += float(row_loss) * float(obj.normalizer(row_in))
  assert float(a_norm) == len(rows) - 1  # the empty row carries no loss
  np.testing.assert_allclose(float(a_loss) * float(a_norm), total, rtol=1e-5)
