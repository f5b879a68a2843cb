"""The real train step on one device: tokens/s and MFU for the recipes' model shapes, with
the attention each `auto` picks and the other implementations where they apply.

  python -m benchmarks.train_mfu [--shapes mars_0_5b,mars_0_5b_compact,card_1b]
      [--impls auto,pallas_gpu,pallas_mgpu,xla,cudnn]
      [--steps 3] [--json OUT.json] [--md OUT.md]

Each shape is a recipe's config with random weights, run by the trainer's own jitted step
(`jit_train_step`: corruption, forward, backward, AdamW, the recipe's bf16 compute, remat,
scan and loss chunking), with grad_accum 1 and the rows trimmed to fit one 80 GB GPU:
  mars_0_5b  configs/mars_qwen2_5_0_5b.py:mars (Qwen2.5-0.5B, MARS, L = 512 so 1024 model
             tokens a row): 48 rows a step, half of one of the recipe's 4 micro-batches of 96
  mars_0_5b_compact  the same rows with the compact noisy stream (noisy_fraction 0.766:
             the response's blocks only, 1.77 L model tokens a row)
  card_1b    configs/card_1b.py (1.03B, CARD, L = 2048): 8 rows a step of the recipe's 1024
The rows carry real-looking structure (a quarter prompt without loss for the SFT shape),
random tokens. MFU is the project's FLOP count (cardjax/train/flops.py: 6 per matmul
parameter per model token, attention 12 * head_dim * heads per visible (query, key) pair
per layer counted on the objective's real mask, rematerialisation not counted) over the
step time and the device's dense bf16 peak (cardjax/peaks.py). `cardjax plan` assumes 40%.
An implementation that cannot serve a shape's mask here (cuDNN for MARS's two streams, any
GPU kernel on a CPU) is a row that says why. Each step time is the median of --steps timed
steps after a compile and one warm step.
"""

from __future__ import annotations

import gc
import statistics
import time

import numpy as np

from benchmarks.common import arg_parser

# name -> (config, rows a step, what was trimmed, more config overrides)
SHAPES = {
    "mars_0_5b": ("configs/mars_qwen2_5_0_5b.py:mars", 48,
                  "48 rows a step, grad_accum 1 (the recipe: 384 rows, grad_accum 4)", ()),
    # The compact noisy stream on the same rows: a quarter prompt, so the noisy stream
    # keeps the response's blocks and the last prompt token's (benchmarks.train_step's
    # compact_fraction(0.25, 512, 8) = 0.765625): (1 + 0.77) L model tokens instead of 2L.
    "mars_0_5b_compact": ("configs/mars_qwen2_5_0_5b.py:mars", 48,
                          "as mars_0_5b, the compact noisy stream",
                          ("--config.objective.noisy_fraction=0.765625",)),
    "card_1b": ("configs/card_1b.py", 8,
                "8 rows a step, grad_accum 1, one device (the recipe: 1024 rows over FSDP)",
                ()),
}
SMOKE_SHAPES = {
    "tiny_mars": ("configs/tiny_mars.py", 4, "toy: L = 32", ("--config.data.seq_len=32",)),
    "tiny_mars_compact": ("configs/tiny_mars.py", 4, "toy: L = 32, compact",
                          ("--config.data.seq_len=32", "--config.objective.noisy_fraction=0.875")),
    "tiny_card": ("configs/tiny_card.py", 4, "toy: L = 32", ("--config.data.seq_len=32",)),
}
COLUMNS = [("shape", "shape", ""), ("attention", "attention", ""), ("rows", "rows", "d"),
           ("seq", "L", "d"), ("step_ms", "step ms", ".1f"),
           ("tokens_per_s", "data tokens/s", ",.0f"), ("tflops", "model TFLOP/s", ".1f"),
           ("mfu", "MFU", ".1%"), ("compile_s", "compile s", ".1f"),
           ("memory_gib", "compiled GiB", ".1f"), ("skipped", "note", "")]


def make_batch(rows: int, seq: int, vocab: int, prompt_share: float) -> dict:
  """Random tokens in [4, vocab); the first `prompt_share` of each row carries no loss."""
  rng = np.random.RandomState(0)
  loss_mask = np.ones((rows, seq), np.int32)
  loss_mask[:, : int(seq * prompt_share)] = 0
  return {"tokens": rng.randint(4, vocab, (rows, seq)).astype(np.int32),
          "positions": np.tile(np.arange(seq, dtype=np.int32), (rows, 1)),
          "segment_ids": np.ones((rows, seq), np.int32), "loss_mask": loss_mask}


def auto_choice(cfg, objective, batch: dict) -> str:
  """The implementation `auto` runs for this objective's training mask here."""
  import jax

  from cardjax.attention.select import choose
  from cardjax.train.step import corrupt_rows, step_row_keys

  one = {k: v[:1] for k, v in batch.items()}
  inputs = corrupt_rows(objective, one, step_row_keys(jax.random.key(0), 0, 1))
  t = inputs.tokens.shape[1]
  d = cfg.resolved_head_dim
  return choose("auto", inputs.mask, (1, t, cfg.num_heads, d), (1, t, cfg.num_kv_heads, d),
                cfg.dtype)


def load(spec: str, rows: int, impl: str, extra=()):
  from cardjax.config import load_config

  return load_config(spec, [f"--config.data.batch_size={rows}", "--config.train.grad_accum=1",
                            f"--config.model.attention_impl={impl}",
                            "--config.train.init_from=", "--config.train.lora.rank=0", *extra])


def time_step(config, batch: dict, steps: int) -> dict:
  """Compile the trainer's step for `config` on one device and time it."""
  import jax
  import jax.numpy as jnp
  from flax import nnx

  from cardjax.config import model_config
  from cardjax.data.pipeline import batch_sharding
  from cardjax.model import create_model
  from cardjax.objectives import make_objective
  from cardjax.parallel import make_mesh
  from cardjax.train import flops
  from cardjax.train.optimizer import make_optimizer, sharded_init
  from cardjax.train.step import jit_train_step

  mesh = make_mesh(1, -1, 1, devices=jax.devices()[:1])
  with jax.set_mesh(mesh):
    cfg = model_config(config)
    objective = make_objective(config.objective, cfg)
    graphdef, params = nnx.split(create_model(cfg, seed=0, mesh=mesh), nnx.Param)
    params = nnx.to_pure_dict(params)
    tx = make_optimizer(config.train, params)
    opt_state = sharded_init(tx, params, mesh)(params)
    step = jit_train_step(graphdef, objective, tx, config.train, 0,
                          jax.tree.map(lambda x: x.sharding, params),
                          jax.tree.map(lambda x: x.sharding, opt_state), batch_sharding(mesh))
    device_batch = {k: jnp.asarray(v) for k, v in batch.items()}
    start = time.perf_counter()
    compiled = step.lower(params, opt_state, device_batch, jnp.int32(0), {}).compile()
    compile_s = time.perf_counter() - start
    mem = compiled.memory_analysis()
    memory = None
    if mem is not None:
      memory = (mem.argument_size_in_bytes + mem.output_size_in_bytes - mem.alias_size_in_bytes
                + mem.temp_size_in_bytes) / 2**30
    params, opt_state, m = compiled(params, opt_state, device_batch, jnp.int32(0), {})
    jax.block_until_ready(m["loss"])
    times = []
    for i in range(steps):
      t0 = time.perf_counter()
      params, opt_state, m = compiled(params, opt_state, device_batch, jnp.int32(i + 1), {})
      jax.block_until_ready(m["loss"])
      times.append(time.perf_counter() - t0)
    loss = float(m["loss"])
  rows, seq = batch["tokens"].shape
  step_s = statistics.median(times)
  flop = flops.train_flops_per_step(cfg, objective, {k: v[:1] for k, v in batch.items()}, rows)
  peak = flops.peak_flops_per_device()
  del params, opt_state, compiled
  gc.collect()
  return {"step_ms": step_s * 1e3, "step_ms_all": [t * 1e3 for t in times],
          "tokens_per_s": rows * seq / step_s,
          "model_tokens_per_s": rows * seq * objective.stream_factor / step_s,
          "flops_per_step": flop, "tflops": flop / step_s / 1e12,
          "mfu": flop / step_s / peak if peak else None, "peak_flops": peak,
          "compile_s": compile_s, "memory_gib": memory, "loss": loss,
          "finite": bool(np.isfinite(loss))}


def main() -> None:
  parser = arg_parser(__spec__, __doc__)
  parser.add_argument("--shapes", default=",".join(SHAPES))
  parser.add_argument("--impls", default="auto,pallas_gpu,pallas_mgpu,xla,cudnn",
                      help="attention implementations, in order (auto's pick is not repeated)")
  parser.add_argument("--steps", type=int, default=3)
  parser.add_argument("--budget-s", type=float, default=0.0,
                      help="start no new row after this many seconds (0: no limit)")
  parser.add_argument("--smoke", action="store_true", help="toy shapes for a CPU check")
  parser.add_argument("--json", default="train_step.json")
  parser.add_argument("--md", default=None)
  args = parser.parse_args()
  shapes = SMOKE_SHAPES if args.smoke else {k: SHAPES[k] for k in args.shapes.split(",") if k}
  impls = [i for i in args.impls.split(",") if i]
  steps = 1 if args.smoke else args.steps

  from cardjax.attention.select import AttentionImplError
  from cardjax.config import model_config
  from cardjax.objectives import make_objective

  from benchmarks.sections import Section

  sizes = {"shapes": {k: {"config": v[0], "rows": v[1], "trimmed": v[2]}
                      for k, v in shapes.items()},
           "impls": impls, "timed_steps": steps, "grad_accum": 1,
           "flops": "cardjax/train/flops.py: 6 x matmul params x model tokens + 12 x head_dim "
                    "x heads x layers x visible pairs; remat not counted",
           "mfu_assumed_by_plan": 0.40}
  section = Section(args.json, args.md, "train_step",
                    "Train step on one device: tokens/s and MFU (plan assumes 40%)", sizes,
                    smoke=args.smoke, budget_s=args.budget_s)
  section.table(COLUMNS)
  # Each shape's auto first (the figure users get), then the other implementations.
  plan = []
  for name, (spec, rows, _, extra) in shapes.items():
    config = load(spec, rows, "auto", extra)
    cfg = model_config(config)
    prompt = 0.25 if config.data.mode == "sft" else 0.0
    batch = make_batch(rows, config.data.seq_len, cfg.vocab_size, prompt)
    chosen = auto_choice(cfg, make_objective(config.objective, cfg), batch)
    plan.append((name, (spec, rows, extra), batch, "auto", chosen))
    section.data["sizes"]["shapes"][name]["auto_picks"] = chosen
  for impl in impls:
    if impl == "auto":
      continue
    for name, how, batch, _, chosen in list(plan[:len(shapes)]):
      if impl != chosen:
        plan.append((name, how, batch, impl, impl))
  for name, (spec, rows, extra), batch, impl, chosen in plan:
    if section.over_budget():
      break
    label = f"auto ({chosen})" if impl == "auto" else impl
    row = {"shape": name, "attention": label, "rows": rows, "seq": batch["tokens"].shape[1]}
    try:
      row.update(time_step(load(spec, rows, impl, extra), batch, steps))
    except AttentionImplError as e:
      row["skipped"] = f"cannot serve this mask here: {str(e).split(': ', 1)[-1][:160]}"
    except Exception as e:  # noqa: BLE001  one failing row (out of memory, say) ends no table
      first = str(e).splitlines()[0][:200] if str(e) else ""
      row["skipped"] = f"failed: {type(e).__name__}: {first}"
    section.row(row)
  timed = [r for r in section.data["rows"] if r.get("mfu") is not None]
  summary = {}
  for r in timed:
    if r["attention"].startswith("auto"):
      summary[f"{r['shape']} MFU (auto)"] = f"{r['mfu']:.1%}"
  section.finish(**summary)


if __name__ == "__main__":
  main()
