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
  # The trained BPE of the embedded datasets puts <|endoftext|> at 0 and <|mask|> at 3.
  c.model.eos_token_id = 0
  c.model.mask_token_id = 3
  c.data.dataset = "python_stdlib"
  c.data.tokenizer_vocab = 512
  c.data.seq_len = 128
  c.data.batch_size = 8
  return c
