"""Converting a model between list and scanned layers keeps its numbers: the same logits
and the same cached decoding."""

import dataclasses

import jax.numpy as jnp
import numpy as np

from cardjax.decoding import ar
from cardjax.model import create_model
from cardjax.model.layout import with_layout
from decoding_helpers import CONFIG, PROMPTS


def test_list_to_scan_and_back_keeps_logits_and_tokens():
  model = create_model(CONFIG, seed=4)
  scanned = with_layout(model, True)
  assert scanned.cfg.scan_layers and not model.cfg.scan_layers
  tokens = jnp.asarray([PROMPTS[0] + PROMPTS[2]], jnp.int32)
  np.testing.assert_allclose(scanned(tokens), model(tokens), rtol=1e-5, atol=1e-5)
  assert ar.generate(scanned, [PROMPTS[0]], 8).rows() == ar.generate(model, [PROMPTS[0]],
                                                                      8).rows()
  back = with_layout(scanned, False)
  np.testing.assert_array_equal(back(tokens), model(tokens))
  assert with_layout(model, False) is model


def test_a_scanned_checkpoint_converts_to_list_layers():
  model = create_model(dataclasses.replace(CONFIG, scan_layers=True), seed=5)
  tokens = jnp.asarray([PROMPTS[3]], jnp.int32)
  np.testing.assert_allclose(with_layout(model, False)(tokens), model(tokens), rtol=1e-5,
                             atol=1e-5)
