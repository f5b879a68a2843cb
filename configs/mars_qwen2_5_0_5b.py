"""MARS on Qwen2.5-0.5B-Instruct, the paper's recipe, in two stages.

  cardjax train --config configs/mars_qwen2_5_0_5b.py:sft  --workdir runs/q05_sft \
      --config.train.init_from=PATH/Qwen2.5-0.5B-Instruct \
      --config.data.options.paths=dolci.jsonl --config.data.tokenizer=PATH/Qwen2.5-0.5B-Instruct
  cardjax train --config configs/mars_qwen2_5_0_5b.py:mars --workdir runs/q05_mars \
      --config.train.init_from=runs/q05_sft/checkpoints ...(same data flags)

Both stages: 5 epochs on the same SFT data (allenai/Dolci-Instruct-SFT as JSONL), length
512, effective batch 384, AdamW lr 5e-6, cosine, 3% warmup, bf16. Set train.steps to
5 * examples / 384 for your copy of the data. MARS adds no parameters: [MASK] is the
`<|mask|>` token in padded embedding row 151665; B = 8 (the paper tries 4, 8 and 16).

Where it runs (`cardjax plan` of the :mars stage, per device, docs/scale.md): one H200 with
grad_accum 4 and loss_chunk 128, as set below: 77.2 of 140 GiB (XLA:GPU's plan; accum 2
needs 145); 3.0 s a step at 40% MFU, 1.1 hours for 1,302 steps. The 7B recipe
(configs/mars_qwen2_5_7b.py) sets its own.
"""

from cardjax.config import load_config

STAGES = ("sft", "mars")


def recipe(model_config_name: str, stage: str):
  if stage not in STAGES:
    raise ValueError(f"pick a stage: {model_config_name}.py:sft or :mars, got {stage!r}")
  c = load_config(model_config_name)
  c.name = f"mars_{model_config_name}_{stage}"
  c.objective.name = "ar" if stage == "sft" else "mars"
  c.objective.block_size = 8
  c.objective.alpha = 1.0
  c.data.dataset = "sft_jsonl"
  c.data.mode = "sft"
  c.data.options = {"paths": ("dolci_instruct_sft.jsonl",), "validation_percent": 1}
  c.data.tokenizer = "Qwen2.5-Instruct"  # a HF folder with tokenizer.json
  c.data.seq_len = 512
  c.data.batch_size = 384
  c.data.pad_to_multiple = 8
  c.data.packing = False
  c.data.num_workers = 8
  c.train.grad_accum = 4  # 96 rows per micro-batch: one H200 (docs/scale.md)
  c.train.loss_chunk = 128  # no [rows, 1024, 151936] float32 logits at once
  c.train.lr = 5e-6
  c.train.schedule = "cosine"
  c.train.warmup_fraction = 0.03
  c.train.min_lr_ratio = 0.0
  c.train.weight_decay = 0.0
  c.train.steps = 5 * 100_000 // 384  # 5 epochs of a 100k-example set; set for your data
  c.train.log_every = 10
  c.train.eval_every = 200
  c.train.checkpoint_every = 500
  return c


def get_config(stage: str = "mars"):
  return recipe("qwen2_5_0_5b", stage)
