"""A tiny Qwen2-style model that runs in seconds on CPU (tests, demo, smoke runs)."""

from cardjax.config import base_config


def get_config():
  c = base_config()
  c.name = "tiny"
  c.model.model_type = "qwen2"
  c.model.vocab_size = 512
  c.model.hidden_size = 64
  c.model.intermediate_size = 192
  c.model.num_layers = 2
  c.model.num_heads = 4
  c.model.num_kv_heads = 2
  c.model.max_position_embeddings = 1024
  c.model.tie_word_embeddings = True
  c.model.mask_token_id = 511  # the last id is reserved as [MASK]
  return c
