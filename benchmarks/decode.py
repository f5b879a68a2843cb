"""Decoding speed and quality of every method against AR with a KV cache, in one run.

  python -m benchmarks.decode [--workdir runs/bench_decode] [--quick] [--no-train]
      [--tasks arith,code] [--seeds 0,1,2] [--train-jobs 2]

1. Builds arith_sft and python_stdlib and trains the models of configs/decode_bench.py
   (sft, then mars from it; ar, then mdlm_a2d from it; card, card_half, mdlm), reusing
   finished runs.
2. arith: AR (SFT model) vs MARS over a tau sweep (window and block-level cache) and
   self-verified MARS; exact match on the test problems.
3. code: AR vs CARD blocks (confidence tau sweep, DUS, EB, CB) for clean_fraction 0 and
   0.5, and MDLM with DUS vs the confidence planner at the same forwards; NLL of the
   continuation under the AR model.
Every model is trained once per --seeds seed (default 0,1,2: init, data order and corruption
keys); quality is the mean and range over seeds, and tokens/s the median and range over
--repeats timings of the first seed's models (the other seeds are decoded once, untimed, at
the largest batch). Prints one table (tokens per forward, tokens/s, speedup over AR at the
same batch size, quality) with the machine, and writes results.json, decode.md and
decode.png under the workdir (and each row to decode_rows.md as it is measured). The
prompt sets are saved as ids in inputs.json, and the runs carry their tokenizers, so
`--no-train` on another machine (a GPU box without the datasets) decodes the same prompts
with the same models: see docs/decoding.md.
Needs matplotlib for the PNG (pip install -e '.[bench]').
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

from cardjax import machine
from cardjax.config import load_config
from cardjax.data.prepare import prepare
from cardjax.decoding.methods import diffusion_family
from cardjax.eval import suite
from cardjax.train import train

from benchmarks.common import Tee, announce, arg_parser, pyplot, run_dir

MODELS = ("sft", "mars", "ar", "card", "card_half", "mdlm", "mdlm_a2d")
# Models trained from another's weights (train.init_from): model -> the run it starts from.
STARTS_FROM = {"mars": "sft", "mdlm_a2d": "ar"}
PROMPT_LEN = 32  # code prompts: ids taken from held-out documents


def trained_runs(workdir: Path, names, seed: int = 0) -> dict[str, Path]:
  """The finished runs under workdir/runs, without training (another machine's runs)."""
  runs = {name: run_dir(workdir, name, seed) for name in names}
  missing = [str(p) for p in runs.values() if not (p / "checkpoints").is_dir()]
  if missing:
    raise SystemExit(f"--no-train: no trained run at {', '.join(missing)}; train them first "
                     "(run without --no-train) or copy them there")
  return runs


def train_models(workdir: Path, data_dir: Path, scale: float, names=MODELS,
                 seed: int = 0) -> dict[str, Path]:
  """Each decode_bench model trained with config.seed = seed (init, data order, corruption),
  or resumed to its last step, under run_dir."""
  runs = {}
  for name in names:
    flags = [f"--config.data.data_dir={data_dir}", "--config.train.progress=false",
             f"--config.seed={seed}"]
    if name in STARTS_FROM:
      start_run = run_dir(workdir, STARTS_FROM[name], seed)
      flags.append(f"--config.train.init_from={start_run / 'checkpoints'}")
    config = load_config(f"configs/decode_bench.py:{name}", flags)
    if scale != 1.0:
      config.train.steps = max(10, int(config.train.steps * scale))
      config.train.checkpoint_every = config.train.steps
    prepare(config)
    start = time.time()
    runs[name] = run_dir(workdir, name, seed)
    check_recipe(runs[name], config.train.steps)
    out = train(config, runs[name])
    loss = out["train"].get("loss")  # none when the run had already finished
    print(f"   {name} (seed {seed}): {config.train.steps} steps, "
          + (f"loss {loss:.3f} ({time.time() - start:.0f}s)" if loss is not None
             else "trained before"), flush=True)
  return runs


def check_recipe(run: Path, steps: int) -> None:
  """Stop before a run trained for another number of steps is resumed under this one's: its
  learning-rate schedule would be two schedules spliced (configs/decode_bench.py changed)."""
  from cardjax import checkpoint

  root = run / "checkpoints"
  if not checkpoint.saved_steps(root):  # new, or stopped before its first save
    return
  saved = checkpoint.read_run_config(root)
  if saved is not None and saved.train.steps != steps:
    raise SystemExit(f"{run} was trained for {saved.train.steps} steps; configs/"
                     f"decode_bench.py now trains {steps}. Use a new --workdir (or delete the "
                     "run) so it trains from the start with one schedule")


def plot(rows: list[dict], path: Path) -> None:
  plt = pyplot()
  fig, (left, right) = plt.subplots(1, 2, figsize=(15, 4.5))
  for ax, task, quality, label in ((left, "arith", "exact_match", "exact match"),
                                   (right, "code", "judge_nll", "NLL under AR (lower is better)")):
    batch = 4 if any(r["batch"] == 4 for r in rows) else rows[0]["batch"]
    groups: dict[str, list] = {}
    for r in rows:
      if r["task"] == task and r["batch"] == batch:
        key = f"{r['model']} {r['method']}" + (
            " cache" if "cache" in r["setting"] and r["method"] == "mars" else "")
        groups.setdefault(key, []).append((r["speedup"], r[quality]))
    # tab20 and a marker per group: the default cycle repeats its 10 colours, and a panel
    # has up to 14 curves
    colours = plt.get_cmap("tab20").colors
    for i, (key, points) in enumerate(sorted(groups.items())):
      points.sort()
      ax.plot([p[0] for p in points], [p[1] for p in points], "-", marker="os^vDP*X"[i % 8],
              color=colours[i % len(colours)], label=key)
    ax.axvline(1.0, color="grey", lw=0.5)
    ax.set_xlabel(f"wall-clock speedup over AR with KV cache (batch {batch})")
    ax.set_ylabel(label)
    ax.set_title(task)
    ax.legend(fontsize=7, loc="upper left", bbox_to_anchor=(1.0, 1.0))  # off the points
  fig.tight_layout()
  fig.savefig(path, dpi=120)


def inputs(workdir: Path, loaded: dict, n_arith: int, n_code: int, arith: bool,
           code: bool) -> dict:
  """The prompt sets, saved as plain ids in workdir/inputs.json on first use and read back
  after: a machine without the datasets (or with another Python, whose stdlib corpus
  differs) decodes exactly the same prompts. A set a run does not need is not built (its
  model may not be trained), and a saved file lacking a needed set is extended."""
  path = workdir / "inputs.json"
  saved = json.loads(path.read_text()) if path.is_file() else {}
  have = {"arith": len(saved.get("arith", {}).get("prompts", [])),
          "code": len(saved.get("code", {}).get("prompts", []))}
  sets = {"arith": saved.get("arith", {"prompts": [], "answers": []}),
          "code": saved.get("code", {"prompts": []})}
  changed = False
  if arith and have["arith"] < n_arith:
    sets["arith"], changed = suite.arith_inputs(loaded["sft"], n_arith), True
  if code and have["code"] < n_code:
    sets["code"], changed = suite.code_inputs(loaded["ar"], n_code, PROMPT_LEN), True
  if changed:
    path.write_text(json.dumps(sets) + "\n")
  return {"arith": {k: v[:n_arith] for k, v in sets["arith"].items()},
          "code": {"prompts": sets["code"]["prompts"][:n_code]}}


def prepare_data(data_dir: Path, names) -> None:
  """Build the datasets the models of `names` train on (a no-op when built)."""
  for name in names:
    prepare(load_config(f"configs/decode_bench.py:{name}",
                        [f"--config.data.data_dir={data_dir}"]))


def training_units(names, seeds: list[int]) -> list[tuple[int, list[str]]]:
  """The runs to train as (seed, names) units, each trained by one job in order: a model
  and those that start from its weights together (sft then mars, ar then mdlm_a2d), every
  other model on its own."""
  units = []
  for seed in seeds:
    for name in names:
      if name in STARTS_FROM and STARTS_FROM[name] in names:
        continue  # trained in its starting model's unit
      units.append((seed, [name] + [n for n in names if STARTS_FROM.get(n) == name]))
  return units


def share_units(units: list[tuple[int, list[str]]], cost, jobs: int) -> list[list]:
  """Units dealt to `jobs` jobs so their total costs come out even: the costliest unit
  first, each to the job with the least so far (unit -> cost: training steps left)."""
  shares, load = [[] for _ in range(jobs)], [0] * jobs
  for unit in sorted(units, key=cost, reverse=True):
    j = load.index(min(load))
    shares[j].append(unit)
    load[j] += cost(unit)
  return [s for s in shares if s]


def steps_left(workdir: Path, data_dir: Path, scale: float, unit) -> int:
  """Training steps a unit still needs: 0 for runs whose final checkpoint is saved."""
  seed, names = unit
  left = 0
  for name in names:
    config = load_config(f"configs/decode_bench.py:{name}",
                         [f"--config.data.data_dir={data_dir}"])
    steps = max(10, int(config.train.steps * scale)) if scale != 1.0 else config.train.steps
    if not (run_dir(workdir, name, seed) / "checkpoints" / str(steps)).is_dir():
      left += steps
  return left


def train_in_jobs(shares: list[list], argv: list[str]) -> None:
  """Train each share of units (share_units) in its own process, all at once: `python -m
  benchmarks.decode --train-units ...` (from the same working directory, the repo root)
  with one XLA CPU thread, pinned to its own core where the OS allows. The models are
  small: one forward does not keep 2 cores busy, and two single-thread trainings on 2
  cores finish in ~0.7x the time of one after the other. The pinning is part of the
  result: XLA:CPU rounds differently under another core mask (docs/reproducibility.md)."""
  import os
  import subprocess

  cores = sorted(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else []
  skip = {"--train-jobs", "--seeds", "--train-units"}
  rest, i = [], 0
  while i < len(argv):  # the parent's flags less those this splits
    flag = argv[i].split("=")[0]
    if flag in skip:
      i += 1 if "=" in argv[i] else 2
      continue
    rest.append(argv[i])
    i += 1
  env = dict(os.environ, XLA_FLAGS=(os.environ.get("XLA_FLAGS", "") + " "
             "--xla_cpu_multi_thread_eigen=false intra_op_parallelism_threads=1").strip())
  procs = []
  for j, share in enumerate(shares):
    spec = ",".join(f"{seed}:{'+'.join(names)}" for seed, names in share)
    cmd = [sys.executable, "-m", "benchmarks.decode", *rest, "--train-units", spec]
    pin = (lambda c=cores[j % len(cores)]: os.sched_setaffinity(0, {c})) if cores else None
    print(f"== train job {j}: {spec}", flush=True)
    procs.append(subprocess.Popen(cmd, env=env, preexec_fn=pin))
  failed = [p.args for p in procs if p.wait() != 0]
  if failed:
    raise SystemExit(f"a training job failed: {failed[0]}")


def parse_units(spec: str) -> list[tuple[int, list[str]]]:
  """'0:sft+mars,1:ar' -> [(0, ['sft', 'mars']), (1, ['ar'])] (what train_in_jobs passes)."""
  units = []
  for item in spec.split(","):
    seed, _, names = item.partition(":")
    bad = [n for n in names.split("+") if n not in MODELS]
    if not seed.isdigit() or not names or bad:
      raise SystemExit(f"--train-units {spec!r}: items look like 0:sft+mars or 1:ar "
                       f"(models: {', '.join(MODELS)})")
    units.append((int(seed), names.split("+")))
  return units


def main() -> None:
  parser = arg_parser(__spec__, __doc__)
  parser.add_argument("--workdir", default="runs/bench_decode")
  parser.add_argument("--quick", action="store_true", help="short training, few prompts")
  parser.add_argument("--no-train", action="store_true",
                      help="use the runs under WORKDIR/runs as they are (copied from the "
                           "machine that trained them); never train or build data")
  parser.add_argument("--train-only", action="store_true",
                      help="train (or reuse) the runs and save inputs.json, decode nothing: "
                           "what `make bench-pack` needs")
  parser.add_argument("--n-arith", type=int, default=128)
  parser.add_argument("--n-code", type=int, default=32)
  parser.add_argument("--batches", default="1,4,16")
  parser.add_argument("--taus", default="1.0,0.95,0.9,0.8,0.6")
  parser.add_argument("--card-taus", default="0.9,0.7,0.5")
  parser.add_argument("--tasks", default="arith,code",
                      help="which tables to train for and decode: arith (sft, mars), code "
                           "(ar and --code-models), or both")
  parser.add_argument("--train-jobs", type=int, default=1,
                      help="train the seeds in this many processes at once (one XLA thread "
                           "each; 2 on a 2-core CPU), then decode")
  parser.add_argument("--code-models", default="card,card_half,mdlm",
                      help="the code models to compare with AR (empty: skip the code task)")
  parser.add_argument("--repeats", type=int, default=5,
                      help="timings per row: tokens/s is their median, with their range")
  parser.add_argument("--min-seconds", type=float, default=1.0,
                      help="a timing repeats the prompt set until it lasts this long")
  parser.add_argument("--train-units", default="", help=argparse.SUPPRESS)  # a --train-jobs job
  parser.add_argument("--seeds", default="0,1,2",
                      help="training seeds: every quality figure is their mean and range; "
                           "the first seed's models are also timed at every batch size")
  args = parser.parse_args()
  workdir = Path(args.workdir).absolute()
  batches = [int(b) for b in args.batches.split(",")]
  seeds = [int(s) for s in args.seeds.split(",")]
  n_arith, n_code, scale = args.n_arith, args.n_code, 1.0
  if args.quick:
    n_arith, n_code, scale = 32, 16, 0.1
  tasks = [t for t in args.tasks.split(",") if t]
  if not tasks or set(tasks) - {"arith", "code"}:
    raise SystemExit(f"--tasks={args.tasks!r}: give arith, code or arith,code")
  arith = "arith" in tasks
  code_models = [m for m in args.code_models.split(",") if m] if "code" in tasks else []
  if not arith and not code_models:
    raise SystemExit("--tasks=code with --code-models '' leaves nothing to run")
  names = (["sft", "mars"] if arith else []) + (["ar"] + code_models if code_models else [])
  if args.train_units:
    for seed, unit in parse_units(args.train_units):
      train_models(workdir, workdir / "data", scale, unit, seed)
    return
  if args.train_jobs > 1 and not args.no_train:
    prepare_data(workdir / "data", names)  # once, here: the jobs would race to build it
    pending = [u for u in training_units(names, seeds)
               if steps_left(workdir, workdir / "data", scale, u)]
    shares = share_units(pending, lambda u: steps_left(workdir, workdir / "data", scale, u),
                         args.train_jobs)
    train_in_jobs(shares, sys.argv[1:])
  info = announce("decode benchmark")
  runs = {}
  for seed in seeds:
    if args.no_train:
      print(f"== 1/3 the trained runs of seed {seed}", flush=True)
      runs[seed] = trained_runs(workdir, names, seed)
    else:
      print(f"== 1/3 train the models of seed {seed} (configs/decode_bench.py)", flush=True)
      runs[seed] = train_models(workdir, workdir / "data", scale, names, seed)
  loaded = {name: suite.load_run(path) for name, path in runs[seeds[0]].items()}
  sets = inputs(workdir, loaded, n_arith, n_code, arith, bool(code_models))
  if args.train_only:
    print(f"== trained {', '.join(names)} for seeds {seeds}; prompt sets in "
          f"{workdir / 'inputs.json'}")
    return
  # Each row printed and kept in decode_rows.md as it comes: a run cut short keeps them.
  log = Tee(workdir / "decode_rows.md", suite.HEADER + "\n")
  taus = [float(t) for t in args.taus.split(",")]
  card_taus = [float(t) for t in args.card_taus.split(",")]

  def decode(loaded, batches, repeats, min_seconds, log):
    rows = []
    if arith:
      rows += suite.arith_rows(loaded["sft"], loaded["mars"], sets["arith"], batches, taus,
                               block=4, cache_block=16, max_new_tokens=96, repeats=repeats,
                               min_seconds=min_seconds, log=log)
    if code_models:
      rows += suite.code_rows(loaded["ar"],
                              {m: loaded[m] for m in code_models
                               if diffusion_family(loaded[m].objective) == "card"},
                              {m: loaded[m] for m in code_models
                               if diffusion_family(loaded[m].objective) == "mdlm"},
                              sets["code"], batches=batches, taus=card_taus,
                              block=8, max_new_tokens=64, repeats=repeats,
                              min_seconds=min_seconds, log=log)
    return rows

  by_seed = {}
  print(f"== 2/3 seed {seeds[0]}: every method at batches {batches}, timed\n" + suite.HEADER,
        flush=True)
  by_seed[seeds[0]] = decode(loaded, batches, args.repeats, args.min_seconds, log)
  for seed in seeds[1:]:
    # Quality only: one untimed pass at the largest batch (the tokens do not depend on it).
    print(f"== 3/3 seed {seed}: quality at batch {max(batches)}\n" + suite.HEADER, flush=True)
    by_seed[seed] = decode({n: suite.load_run(p) for n, p in runs[seed].items()}, [max(batches)],
                           1, 0.0, print)
  rows = suite.merge_seeds(by_seed)
  (workdir / "results.json").write_text(json.dumps(
      {"machine": info, "args": vars(args), "rows": rows,
       "by_seed": {str(k): v for k, v in by_seed.items()}}, indent=2) + "\n")
  (workdir / "decode.md").write_text(
      f"Machine: {machine.line(info)}; quality: mean [range] over seeds {seeds}; tokens/s: "
      f"seed {seeds[0]}'s models, median [range] of {args.repeats} repeats\n\n"
      + suite.table(rows) + "\n")
  print("\n" + suite.table(rows))
  try:
    plot(rows, workdir / "decode.png")
    print(f"== wrote {workdir / 'decode.png'}")
  except ImportError:
    print("== no PNG: matplotlib is missing (pip install -e '.[bench]')")
  print(f"== table in {workdir / 'decode.md'}, rows in {workdir / 'results.json'}")


if __name__ == "__main__":
  main()
