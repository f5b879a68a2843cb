"""How far an arith recipe's exact match moves with the seed, and when in training it settles.

  python -m benchmarks.studies.recipe_spread --config configs/decode_bench.py:sft --seeds 0,1,2 \
      --every 500 --workdir runs/spread/sft [--config.train.lr=1e-3 ...]

Trains the recipe once per seed (config.seed sets the init, the data order and the
corruption keys), keeping a checkpoint every --every steps, then decodes the first --n
arith_sft test problems greedily (AR with a KV cache) from every checkpoint and prints exact
match by step and seed, with the mean and range over seeds. A recipe whose exact match is
still climbing steeply at its last step, or whose seeds disagree by tens of points, will not
reproduce on another processor either: a different rounding is, to such a recipe, another
seed. Any `--config.KEY=VALUE` flag is passed on to every seed's config; `--init-from` takes a
`{seed}` placeholder for a second stage (MARS from each seed's own SFT run). Finished runs are
reused, so a cut-short study resumes. Writes WORKDIR/spread.json with the machine.
"""

from __future__ import annotations

import json
import statistics
from pathlib import Path

from cardjax import checkpoint
from cardjax.config import load_config
from cardjax.data import arith
from cardjax.data.prepare import prepare
from cardjax.eval import inputs, measure
from cardjax.decoding.methods import Options, make_decoder
from cardjax.train import train

from benchmarks.common import announce, arg_parser


def grade_at(run: Path, step: int, prompts, answers, batch: int,
             max_new_tokens: int) -> tuple[float, float]:
  """(exact match, share of the worked steps "a op b = c." that are right) at a checkpoint."""
  model, _ = checkpoint.restore_model(run / "checkpoints", step=step)
  tok = checkpoint.load_tokenizer(run / "checkpoints", model.cfg)
  opt = Options(max_new_tokens=max_new_tokens, stop_ids=tok.stop_ids, pad_id=tok.pad_id)
  got = measure.timed(make_decoder("ar", model, None, opt), prompts, batch)
  steps = [arith.step_accuracy(tok.decode(r, skip_special=True)) for r in got.rows]
  right, written = sum(s[0] for s in steps), sum(s[1] for s in steps)
  return measure.exact_match(got.rows, answers, tok), right / max(written, 1)


def main() -> None:
  parser = arg_parser(__spec__, __doc__)
  parser.add_argument("--config", default="configs/decode_bench.py:sft")
  parser.add_argument("--seeds", default="0,1,2")
  parser.add_argument("--every", type=int, default=500, help="steps between checkpoints")
  parser.add_argument("--workdir", default="runs/spread/sft")
  parser.add_argument("--init-from", default="",
                      help="train.init_from per seed; '{seed}' is replaced by the seed")
  parser.add_argument("--n", type=int, default=128, help="arith_sft test problems")
  parser.add_argument("--batch", type=int, default=16)
  parser.add_argument("--max-new-tokens", type=int, default=96)
  args, overrides = parser.parse_known_args()
  bad = [o for o in overrides if not o.startswith("--config.")]
  if bad:
    parser.error(f"unknown arguments {bad}; config overrides look like --config.train.lr=1e-3")
  workdir = Path(args.workdir).absolute()
  seeds = [int(s) for s in args.seeds.split(",")]
  info = announce()

  runs, prompts, answers = {}, None, None
  table: dict[int, dict[int, tuple[float, float]]] = {}
  for seed in seeds:
    flags = [f"--config.seed={seed}", f"--config.data.data_dir={workdir.parent / 'data'}",
             "--config.train.progress=false", f"--config.train.checkpoint_every={args.every}",
             "--config.train.keep_checkpoints=1000", *overrides]
    if args.init_from:
      flags.append(f"--config.train.init_from={args.init_from.format(seed=seed)}")
    config = load_config(args.config, flags)
    if config.data.dataset != "arith_sft":
      raise SystemExit(f"{args.config} trains on {config.data.dataset}; this study grades "
                       "arith_sft exact match, so it needs an arith_sft recipe")
    prepare(config)
    runs[seed] = workdir / f"seed{seed}"
    out = train(config, runs[seed])
    loss = out["train"].get("loss")
    print(f"   seed {seed}: {config.train.steps} steps"
          + (f", final loss {loss:.3f}" if loss is not None else " (trained before)"),
          flush=True)
    if prompts is None:
      tok = checkpoint.load_tokenizer(runs[seed] / "checkpoints",
                                      checkpoint.read_model_config(runs[seed] / "checkpoints"))
      prompts, answers = inputs.arith_problems(config, tok, args.n)
    # Graded as each seed finishes: a study cut short keeps the seeds it graded.
    for step in checkpoint.saved_steps(runs[seed] / "checkpoints"):
      table.setdefault(step, {})[seed] = grade_at(
          runs[seed], step, prompts, answers, args.batch, args.max_new_tokens)
      em, acc = table[step][seed]
      print(f"   seed {seed} step {step}: exact match {100 * em:.1f}%, worked steps right "
            f"{100 * acc:.1f}%", flush=True)

  print(f"\nexact match (and right worked steps) on the first {len(prompts)} arith_sft test "
        "problems, AR greedy\n| step | " + " | ".join(f"seed {s}" for s in seeds)
        + " | mean | range |\n|---|" + "---|" * (len(seeds) + 2))
  rows = []
  for step in sorted(table):
    got = [table[step].get(s) for s in seeds]
    ems = [g[0] for g in got if g is not None]
    mean = statistics.mean(ems)
    rows.append({"step": step, "exact_match": {str(s): g and g[0] for s, g in zip(seeds, got)},
                 "step_accuracy": {str(s): g and g[1] for s, g in zip(seeds, got)},
                 "mean": mean, "min": min(ems), "max": max(ems)})
    cells = ["-" if g is None else f"{100 * g[0]:.1f}% ({100 * g[1]:.1f}%)" for g in got]
    print(f"| {step} | " + " | ".join(cells)
          + f" | {100 * mean:.1f}% | {100 * (max(ems) - min(ems)):.1f} points |", flush=True)
  (workdir / "spread.json").write_text(json.dumps(
      {"machine": info, "args": vars(args), "overrides": overrides, "rows": rows}, indent=1))
  print(f"\nwrote {workdir / 'spread.json'}")


if __name__ == "__main__":
  main()
