"""The decode loops' CPU compiler options: YNNPACK dots off, on CPU only, opt-out by env."""

import jax
import jax.numpy as jnp
import numpy as np

from cardjax.decoding import cpu_options, mars
from cardjax.decoding.frozen import freeze
from cardjax.model import ModelConfig, create_model


def _skinny_dot(x, w):
  return x @ w


def test_options_on_cpu_turn_ynn_dots_off():
  cpu_options.decode_compiler_options.cache_clear()
  assert cpu_options.decode_compiler_options() == {cpu_options.YNN_OPTION: ""}
  args = (jnp.ones((8, 64)), jnp.ones((64, 96)))
  text = cpu_options.jit(_skinny_dot).lower(*args).compile().as_text()
  assert "__ynn_fusion" not in text
  # The same result either way: only the dot's library changes.
  np.testing.assert_allclose(cpu_options.jit(_skinny_dot)(*args), jax.jit(_skinny_dot)(*args))


def test_env_keeps_xla_default(monkeypatch):
  monkeypatch.setenv("CARDJAX_CPU_YNN_DOTS", "1")
  cpu_options.decode_compiler_options.cache_clear()
  try:
    assert cpu_options.decode_compiler_options() is None
  finally:
    monkeypatch.delenv("CARDJAX_CPU_YNN_DOTS")
    cpu_options.decode_compiler_options.cache_clear()


def test_decoders_compile_with_the_options(monkeypatch):
  made = []
  real = cpu_options.jit

  def spy(fn, **kwargs):
    made.append(kwargs)
    return real(fn, **kwargs)

  monkeypatch.setattr(cpu_options, "jit", spy)
  cfg = ModelConfig(vocab_size=64, hidden_size=32, intermediate_size=64, num_layers=2,
                    num_heads=2, num_kv_heads=1, max_position_embeddings=64,
                    mask_token_id=3)
  model = create_model(cfg)
  frozen_out = mars.generate(freeze(model), [[5, 6, 7, 8]], 8, block=4, tau=1.0, mask_id=3)
  assert made, "the Frozen model's decode loop was not compiled through cpu_options.jit"
  # The module path (a DecodeLoop's own jit) gives the same tokens.
  np.testing.assert_array_equal(
      np.asarray(mars.generate(model, [[5, 6, 7, 8]], 8, block=4, tau=1.0, mask_id=3).tokens),
      np.asarray(frozen_out.tokens))
