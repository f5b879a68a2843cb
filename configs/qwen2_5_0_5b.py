"""Qwen2.5-0.5B-Instruct, as published (config.json of the Hugging Face release).

bf16 compute over fp32 master weights; tied embeddings; [MASK] takes the first free padded
row of the embedding (151665, after the 22 added special tokens) -- configurable because the
MARS paper's choice could not be checked.
"""

from cardjax.config import base_config


def get_config():
  c = base_config()
  c.name = "qwen2_5_0_5b"
  m = c.model
  m.model_type = "qwen2"
  m.vocab_size = 151936
  m.hidden_size = 896
  m.intermediate_size = 4864
  m.num_layers = 24
  m.num_heads = 14
  m.num_kv_heads = 2
  m.rms_norm_eps = 1e-6
  m.rope_theta = 1000000.0
  m.max_position_embeddings = 32768
  m.tie_word_embeddings = True
  m.bos_token_id = 151643
  m.eos_token_id = 151645
  m.mask_token_id = 151665
  m.dtype = "bfloat16"
  m.scan_layers = True
  m.remat = "dots_no_batch"
  return c
