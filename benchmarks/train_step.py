"""Train-step cost of every objective on one model and the same tokens, as ratios to AR.

  python -m benchmarks.train_step [--hidden 256 --layers 4 --seq 256 --batch 8 --steps 10]
      [--prompt-fraction 0.25] [--json OUT]

Each objective runs the real jitted train step (corruption, forward, backward, AdamW) on
the same batch: rows of `seq` tokens whose first --prompt-fraction is a prompt (no loss)
and the rest a response, so the SFT objectives see what they train on. MARS runs twice: with
the full noisy copy of the row (2L tokens) and with the compact noisy stream that holds only
the blocks that carry loss (objective.noisy_fraction: the response's share plus one block,
the same loss). Prints step time, data tokens/s, model tokens/s and the ratio to AR,
measured in one run. The papers' claims: CARD trains at AR cost (<= 1.10x), MARS about 2x
(it reads 2L tokens; target <= 2.2x), BD3LM 3x CARD.
"""

from __future__ import annotations

import json
import os
import time

import jax
import jax.numpy as jnp
import numpy as np
from flax import nnx

from cardjax.config import base_config
from cardjax.model import ModelConfig, create_model
from cardjax.objectives import make_objective
from cardjax.train.optimizer import make_optimizer
from cardjax.train.step import make_train_step

from benchmarks.common import announce, arg_parser

OBJECTIVES = ("ar", "card", "mars", "mars_compact", "mdlm", "bd3lm")


def compact_fraction(prompt_fraction: float, seq: int, block: int) -> float:
  """The noisy stream's share that holds a response of (1 - prompt_fraction) * seq tokens:
  its blocks and the block of the last prompt token."""
  prompt = int(prompt_fraction * seq)
  first = (prompt - 1) // block * block if prompt else 0  # the block the first target is in
  return (seq - first) / seq


def batch(rows: int, seq: int, vocab: int, prompt_fraction: float = 0.25) -> dict:
  rng = np.random.RandomState(0)
  tokens = rng.randint(4, vocab, (rows, seq)).astype(np.int32)
  loss_mask = np.ones((rows, seq), np.int32)
  loss_mask[:, : int(prompt_fraction * seq)] = 0
  return {"tokens": jnp.asarray(tokens),
          "positions": jnp.asarray(np.tile(np.arange(seq, dtype=np.int32), (rows, 1))),
          "segment_ids": jnp.ones((rows, seq), jnp.int32),
          "loss_mask": jnp.asarray(loss_mask)}


def time_objective(name: str, cfg: ModelConfig, data: dict, steps: int, block: int,
                   **fields) -> float:
  config = base_config()
  config.objective.name = name
  config.objective.block_size = block
  for key, value in fields.items():
    config.objective[key] = value
  config.train.steps = 1000
  model = create_model(cfg, seed=0)
  graphdef, params = nnx.split(model, nnx.Param)
  params = nnx.to_pure_dict(params)
  objective = make_objective(config.objective, cfg)
  tx = make_optimizer(config.train, params)
  opt_state = tx.init(params)
  step = jax.jit(make_train_step(graphdef, objective, tx, 0, 1), donate_argnums=(0, 1))
  params, opt_state, m = step(params, opt_state, data, jnp.int32(0))  # compile
  jax.block_until_ready(m["loss"])
  start = time.perf_counter()
  for i in range(steps):
    params, opt_state, m = step(params, opt_state, data, jnp.int32(i + 1))
  jax.block_until_ready(m["loss"])
  return (time.perf_counter() - start) / steps, objective.stream_factor


def main():
  parser = arg_parser(__spec__, __doc__)
  parser.add_argument("--hidden", type=int, default=256)
  parser.add_argument("--layers", type=int, default=4)
  parser.add_argument("--heads", type=int, default=4)
  parser.add_argument("--vocab", type=int, default=4096)
  parser.add_argument("--seq", type=int, default=256)
  parser.add_argument("--batch", type=int, default=8)
  parser.add_argument("--block", type=int, default=8)
  parser.add_argument("--steps", type=int, default=10)
  parser.add_argument("--prompt-fraction", type=float, default=0.25,
                      help="the share of each row that is prompt (no loss)")
  parser.add_argument("--dtype", default="float32", help="compute dtype (bfloat16 on GPU/TPU)")
  parser.add_argument("--json", default="", help="also write the rows and the machine here")
  args = parser.parse_args()
  cfg = ModelConfig(vocab_size=args.vocab, hidden_size=args.hidden,
                    intermediate_size=args.hidden * 3, num_layers=args.layers,
                    num_heads=args.heads, num_kv_heads=args.heads, mask_token_id=3,
                    dtype=args.dtype, max_position_embeddings=max(2048, args.seq))
  data = batch(args.batch, args.seq, args.vocab, args.prompt_fraction)
  noisy = compact_fraction(args.prompt_fraction, args.seq, args.block)
  machine = announce("train step")
  print(f"model: {args.layers} layers x {args.hidden} wide, vocab {args.vocab}, "
        f"{args.batch} rows x {args.seq} tokens ({args.prompt_fraction:.2f} prompt), block "
        f"{args.block}, {args.dtype}; mars_compact: noisy_fraction {noisy:.3f}")
  times = {}
  for name in OBJECTIVES:
    if name == "mars_compact":
      times[name] = time_objective("mars", cfg, data, args.steps, args.block,
                                   noisy_fraction=noisy)
    else:
      times[name] = time_objective(name, cfg, data, args.steps, args.block)
  data_tokens = args.batch * args.seq
  ar = times["ar"][0]
  print("| objective | step ms | data tok/s | model tok/s | vs AR |")
  print("|---|---|---|---|---|")
  for name, (seconds, factor) in times.items():
    print(f"| {name} | {seconds * 1e3:.1f} | {data_tokens / seconds:,.0f} | "
          f"{factor * data_tokens / seconds:,.0f} | {seconds / ar:.2f}x |")
  if args.json:
    rows = [{"objective": name, "step_ms": seconds * 1e3,
             "data_tokens_per_s": data_tokens / seconds,
             "model_tokens_per_s": factor * data_tokens / seconds, "vs_ar": seconds / ar}
            for name, (seconds, factor) in times.items()]
    os.makedirs(os.path.dirname(args.json) or ".", exist_ok=True)
    with open(args.json, "w") as f:
      json.dump({"settings": vars(args), "noisy_fraction": noisy, "rows": rows,
                 "machine": machine}, f, indent=2)
      f.write("\n")
  card, mars, bd3lm = times["card"][0], times["mars"][0], times["bd3lm"][0]
  compact = times["mars_compact"][0]
  print(f"CARD/AR {card / ar:.2f} (target <= 1.10); MARS/AR {compact / ar:.2f} (compact noisy "
        f"stream, noisy_fraction {noisy:.3f}; the full copy {mars / ar:.2f}, target <= 2.2); "
        f"BD3LM/CARD {bd3lm / card:.2f} (paper: about 3)")


if __name__ == "__main__":
  main()
