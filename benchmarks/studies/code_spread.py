"""How far a code recipe moves with its seed (and its rounding), and whether it has settled.

  python -m benchmarks.studies.code_spread --workdir runs/bench_decode --models card,card_half \
      --seeds 0,1,2 [--extra mask2=runs/other/runs/seed2/card@2]

Trains nothing: it grades every checkpoint kept by the code models that benchmarks.decode
trained under WORKDIR/runs (seed 0 in runs/NAME, seed S in runs/seedS/NAME; the code recipes
of configs/decode_bench.py keep one every 800 steps). Per checkpoint:
- judge NLL: the greedy AR continuation (64 tokens) of the code prompts in
  WORKDIR/inputs.json, scored by the same seed's AR model (its newest checkpoint). This is
  the quality the code table prints for "NAME, AR + KV cache" (for mdlm, which has no AR
  order: its DUS row, blocks of 8);
- held-out NLL: the checkpoint's own AR-order NLL on the first --batches batches of the
  validation split (what `cardjax eval --task nll` prints; for mdlm its own diffusion loss,
  a bound on the NLL): how far training got, without the jumps of greedy text.
A recipe whose seeds disagree by nats, or whose last checkpoints still move, is not a result:
another processor's rounding is, to such a recipe, another seed. `--extra LABEL=RUN@SEED`
adds a run trained elsewhere (e.g. the same seed under another core mask) as a further
column, judged by that seed's AR model. Prints a table per model and writes
WORKDIR/code_spread.json with the machine.
"""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path

from cardjax import checkpoint
from cardjax.decoding.methods import Options, make_decoder
from cardjax.eval import measure, nll
from cardjax.restore import LoadedRun, load_run

from benchmarks.common import announce, arg_parser, run_dir, spread

NEW_TOKENS, BLOCK = 64, 8  # as the code table (benchmarks/decode.py)


def at_step(latest: LoadedRun, step: int) -> LoadedRun:
  """The run's checkpoint at `step`, with the config, tokenizer and objective of its
  newest one (the same run)."""
  if step == latest.step:
    return latest
  model, _ = checkpoint.restore_model(latest.root, step=step)
  return LoadedRun(model, latest.config, latest.tokenizer, latest.objective, step, latest.root)


def grade(loaded: LoadedRun, judge: LoadedRun, prompts, data_dir: str, batches: int,
          batch: int) -> dict:
  """{'judge_nll', 'heldout_nll'} of one checkpoint."""
  opt = Options(max_new_tokens=NEW_TOKENS, pad_id=loaded.tokenizer.pad_id, block=BLOCK)
  method = "ar"
  if loaded.objective == "mdlm":  # bidirectional: no AR order; the table's DUS row
    method, opt = "dus", dataclasses.replace(opt, shift=bool(loaded.config.objective.shift))
  got = measure.timed(make_decoder(method, loaded.frozen, loaded.objective, opt), prompts, batch)
  config = nll.data_config(loaded, data_dir=data_dir)
  held = nll.evaluate_nll(loaded, config, nll.default_split(config), batches, progress=False)
  return {"judge_nll": measure.judge_nll(judge.model, prompts, got.rows),
          "heldout_nll": held["loss" if loaded.objective == "mdlm" else "ar_nll"]}


def main() -> None:
  parser = arg_parser(__spec__, __doc__)
  parser.add_argument("--workdir", default="runs/bench_decode")
  parser.add_argument("--models", default="card,card_half")
  parser.add_argument("--seeds", default="0,1,2")
  parser.add_argument("--extra", action="append", default=[],
                      help="LABEL=RUN_DIR@SEED: another run of the recipe its folder is named "
                           "for (.../card), judged by SEED's AR model, as its own column")
  parser.add_argument("--batches", type=int, default=8, help="validation batches (held-out NLL)")
  parser.add_argument("--batch", type=int, default=16, help="prompts decoded together")
  args = parser.parse_args()
  workdir = Path(args.workdir).absolute()
  seeds = [int(s) for s in args.seeds.split(",")]
  models = [m for m in args.models.split(",") if m]
  inputs_file = workdir / "inputs.json"
  if not inputs_file.is_file():
    raise SystemExit(f"{inputs_file} is missing: train with python -m benchmarks.decode --tasks "
                     "code --train-only first (it writes the prompt sets)")
  prompts = json.loads(inputs_file.read_text())["code"]["prompts"]
  extras = []
  for item in args.extra:
    label, _, rest = item.partition("=")
    path, _, seed = rest.rpartition("@")
    if not (label and path and seed.isdigit()):
      raise SystemExit(f"--extra {item!r}: write LABEL=RUN_DIR@SEED")
    extras.append((label, Path(path).absolute(), int(seed)))
  info = announce()

  judges: dict[int, LoadedRun] = {}

  def judge(seed: int) -> LoadedRun:
    if seed not in judges:
      judges[seed] = load_run(run_dir(workdir, "ar", seed))
    return judges[seed]

  data_dir = str(workdir / "data")
  report = {"machine": info, "args": vars(args), "models": {}}
  for name in models:
    columns = [(f"seed {s}", run_dir(workdir, name, s), s) for s in seeds]
    columns += [(label, path, seed) for label, path, seed in extras if path.name == name]
    table: dict[int, dict[str, dict]] = {}
    for label, run, seed in columns:
      steps = checkpoint.saved_steps(run / "checkpoints")
      latest = load_run(run) if steps else None
      for step in steps:
        table.setdefault(step, {})[label] = got = grade(
            at_step(latest, step), judge(seed), prompts, data_dir, args.batches, args.batch)
        print(f"   {name} {label} step {step}: judge NLL {got['judge_nll']:.3f}, held-out "
              f"NLL {got['heldout_nll']:.3f}", flush=True)
    labels = [c[0] for c in columns]
    print(f"\n{name}: judge NLL of the greedy continuation (held-out NLL), "
          f"{len(prompts)} prompts\n| step | " + " | ".join(labels)
          + f" | judge NLL over seeds {seeds} | held-out NLL over seeds |\n|---|"
          + "---|" * (len(labels) + 2))
    for step in sorted(table):
      cells = [table[step].get(l) for l in labels]
      seeded = [table[step][f"seed {s}"] for s in seeds if f"seed {s}" in table[step]]
      print(f"| {step} | " + " | ".join(
          "-" if c is None else f"{c['judge_nll']:.2f} ({c['heldout_nll']:.2f})" for c in cells)
          + " | " + (spread([c["judge_nll"] for c in seeded]) if seeded else "-")
          + " | " + (spread([c["heldout_nll"] for c in seeded]) if seeded else "-") + " |",
          flush=True)
    report["models"][name] = {str(step): row for step, row in sorted(table.items())}
  out = workdir / "code_spread.json"
  out.write_text(json.dumps(report, indent=1) + "\n")
  print(f"\nwrote {out}")


if __name__ == "__main__":
  main()
