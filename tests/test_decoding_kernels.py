"""Decoding through the attention kernels: with attention_impl=pallas_gpu every cached
forward (prefill and steps) runs the flash-decoding kernel (interpret mode on CPU), and the
decoders give the tokens of the xla path; the log names the kernel."""

import dataclasses
import functools
import logging

import numpy as np
import pytest

from cardjax.attention import select
from cardjax.decoding import ar, mars, mars_verify
from cardjax.model import ModelConfig, create_model
from decoding_helpers import PROMPTS

MASK = 63
# head_dim 16: the smallest the Triton tiles take (the shared tiny model's is 8).
CONFIG = ModelConfig(vocab_size=64, hidden_size=64, intermediate_size=96, num_layers=2,
                     num_heads=4, num_kv_heads=2, initializer_range=0.3, mask_token_id=MASK)


@functools.cache
def model(impl: str):
  return create_model(dataclasses.replace(CONFIG, attention_impl=impl), seed=1)


DECODERS = {
    "ar": lambda m: ar.generate(m, PROMPTS, max_new_tokens=6),
    "mars": lambda m: mars.generate(m, PROMPTS, max_new_tokens=6, block=3, tau=0.5,
                                    mask_id=MASK),
    "mars_verify": lambda m: mars_verify.generate(m, PROMPTS, max_new_tokens=6, block=3,
                                                  mask_id=MASK),
}


@pytest.mark.parametrize("name", sorted(DECODERS))
def test_decoders_through_the_decode_kernel_equal_xla(name, monkeypatch, caplog):
  monkeypatch.setenv(select.INTERPRET_ENV, "1")
  monkeypatch.setattr(select, "_logged", set())  # each choice is logged once per process
  caplog.set_level(logging.INFO, logger="cardjax.attention")
  want = DECODERS[name](model("xla"))
  got = DECODERS[name](model("pallas_gpu"))
  np.testing.assert_array_equal(got.tokens, want.tokens)
  np.testing.assert_array_equal(got.lengths, want.lengths)
  assert got.forwards == want.forwards
  assert any("cached decoding forwards run pallas_decode" in r.getMessage()
             for r in caplog.records)


def test_explicit_kernel_off_gpu_without_interpret_is_an_error(monkeypatch):
  monkeypatch.delenv(select.INTERPRET_ENV, raising=False)
  # New shapes: a trace, where the path is chosen (a cached jit would not choose again).
  with pytest.raises(select.AttentionImplError, match="pallas_decode, a GPU kernel"):
    ar.generate(model("pallas_gpu"), PROMPTS[:1], max_new_tokens=2)
