"""CARD at the paper's scale: a 1B causal decoder on 300B tokens (FineWeb-Edu).

The paper does not publish its architecture, so this is a choice: a Llama-style decoder
(RMSNorm, SwiGLU, RoPE, no biases) of 18 layers, width 2048, 16 heads of 128, full MHA,
intermediate 5632, tied embeddings over a 50304-row vocabulary (the GPT-NeoX tokenizer's
50277 ids padded to a multiple of 64; [MASK] = 50277, the first free row). That is 1.03B
parameters (925M in the blocks): the TinyLlama / OLMo-1B class, which trains at AR cost on
a pod slice. Sequence 2048, 1024 rows per step (2.1M tokens), 143,051 steps = 300B tokens,
AdamW 4e-4 with 2000 warmup steps and cosine to 10%, bf16 compute over fp32 master weights,
scanned + rematerialised layers, FSDP over every device.

Data: point data.options.paths at the FineWeb-Edu text (JSONL with a "text" field) and
data.tokenizer at a HF tokenizer folder of the GPT-NeoX tokenizer.

Where it runs (`cardjax plan`, per device, docs/scale.md; days at 40% MFU):
  v5p-128 (64 chips)  as shipped, grad_accum 1: 51.4 of 95 GiB; 2.0 days
  v5p-64 (32 chips)   --config.train.grad_accum=2: 45.1 of 95 GiB; 3.9 days
  8xH200              --config.train.grad_accum=4: 74.6 of 140 GiB (XLA:GPU's plan); 7.3 days
                      (attention_impl=auto, cuDNN attention: grad_accum 2, 134.1 GiB)
"""

from cardjax.config import base_config


def get_config():
  c = base_config()
  c.name = "card_1b"
  m = c.model
  m.model_type = "llama"
  m.vocab_size = 50304
  m.hidden_size = 2048
  m.intermediate_size = 5632
  m.num_layers = 18
  m.num_heads = 16
  m.num_kv_heads = 16
  m.rope_theta = 10000.0
  m.rms_norm_eps = 1e-5
  m.max_position_embeddings = 2048
  m.qkv_bias = False
  m.tie_word_embeddings = True
  m.eos_token_id = 0
  m.mask_token_id = 50277
  m.dtype = "bfloat16"
  m.scan_layers = True
  m.remat = "dots_no_batch"
  c.objective.name = "card"
  c.data.dataset = "text_corpus"
  c.data.options = {"paths": ("fineweb-edu/*.jsonl",), "text_field": "text",
                    "validation_percent": 1}
  c.data.tokenizer = "tokenizers/gpt-neox-20b"
  c.data.seq_len = 2048
  c.data.batch_size = 1024
  c.data.num_workers = 8
  # 64 data shards: the run resumes on 1 to 64 hosts (v5p-128 has 16; a smaller or larger
  # slice after a preemption), each host reading only its shards' files of a bucket build.
  c.data.shards = 64
  c.train.steps = 143_051
  c.train.lr = 4e-4
  c.train.warmup_steps = 2000
  c.train.schedule = "cosine"
  c.train.min_lr_ratio = 0.1
  c.train.weight_decay = 0.1
  c.train.grad_clip = 1.0
  c.train.log_every = 50
  c.train.eval_every = 2000
  c.train.eval_steps = 50
  c.train.checkpoint_every = 2000
  c.train.checkpoint_minutes = 30.0  # at most half an hour lost to a crash without warning
  c.train.keep_every = 20_000  # milestones kept for good (a rollback or an ablation point)
  c.mesh.data, c.mesh.fsdp, c.mesh.tensor = 1, -1, 1
  return c
