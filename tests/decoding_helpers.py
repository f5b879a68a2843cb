"""The tiny random model and the prompts the decoding tests share.

initializer_range 0.3 gives peaked, varied logits, so greedy paths differ between prompts
and thresholds actually bite; [MASK] is the last id.
"""

import dataclasses
import functools

from cardjax.model import ModelConfig, create_model

MASK = 63
CONFIG = ModelConfig(vocab_size=64, hidden_size=32, intermediate_size=64, num_layers=2,
                     num_heads=4, num_kv_heads=2, initializer_range=0.3, mask_token_id=MASK)
# Different lengths (left padding), a one-token prompt, a repetitive one.
PROMPTS = [[5, 9, 2, 33, 7], [1], [60, 61, 62], [8, 8, 8, 8, 8, 8, 8, 8]]


@functools.cache
def tiny_model(scan: bool = False):
  """Seed 1 with list or scanned layers, built once per session: tests only read it."""
  return create_model(dataclasses.replace(CONFIG, scan_layers=scan), seed=1)
