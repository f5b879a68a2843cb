"""Qwen2.5-7B-Instruct, as published (config.json of the Hugging Face release).

Untied embeddings and a 152064-row vocabulary (the 0.5B model has 151936). bf16 compute over
fp32 master weights; [MASK] = 151665 (a padded row; configurable).
"""

from cardjax.config import base_config


def get_config():
  c = base_config()
  c.name = "qwen2_5_7b"
  m = c.model
  m.model_type = "qwen2"
  m.vocab_size = 152064
  m.hidden_size = 3584
  m.intermediate_size = 18944
  m.num_layers = 28
  m.num_heads = 28
  m.num_kv_heads = 4
  m.rms_norm_eps = 1e-6
  m.rope_theta = 1000000.0
  m.max_position_embeddings = 32768
  m.tie_word_embeddings = False
  m.bos_token_id = 151643
  m.eos_token_id = 151645
  m.mask_token_id = 151665
  m.dtype = "bfloat16"
  m.scan_layers = True
  m.remat = "dots_no_batch"
  c.mesh.tensor = 1
  return c
