"""The CARD paper's training claims in miniature, on any corpus: does CARD keep improving
when data repeats while AR overfits, and what does a CARD step cost against AR and BD3LM?

  python -m benchmarks.studies.card_claims [--corpus 'DIR/**/*.txt' | readmes] \
      [--tokens 40000] [--epochs 1,2,4,8,16,32,48] [--seeds 0,1,2] [--json OUT]
  python -m benchmarks.studies.card_claims --budgets 600,2400,9600 [--seeds 0,1,2]

Data-limited curves (the default): the training split is cut at --tokens tokens and seen
again every epoch. For each seed, AR, CARD (the paper's recipe: soft tail, context
reweighting, every row corrupted) and CARD with half its rows clean (the variant the
project's decode benchmark recommends) train the same model with the same optimizer, batch
and schedule, and their validation NLL in AR order (CARD read as the causal LM it is) is
recorded for every listed epoch count. Each epoch count is its own warmup-stable-decay run,
ending with a decay over its last fifth, so a point is what training that many epochs gives;
the runs share their common constant-rate part (benchmarks/studies/forked_wsd.py), which
makes all of them cost about 1.25 runs of the longest. Reported both ways: CARD against AR
at equal epochs (the first listed epoch count at which CARD's mean is below AR's: the
crossover) and best against best (each objective stopped at its own best epoch count), with
the seeds' range. The train steps of AR, CARD, MDLM and BD3LM are timed on one batch of
the same rows, in interleaved rounds, for their ratios with a range.

--budgets: one pass over the corpus instead (no cap unless --tokens names one; a budget that
needs more rows than the split holds repeats it, and the report says so): CARD / AR
validation NLL at each budget in steps, all seeds at the smaller budgets and the first seed
at the largest.

--corpus: a glob of text files (text_corpus, 10% of files held out), `readmes` (the package
descriptions in the running interpreter's installed distributions, prose and markdown), or
python_stdlib (the embedded corpus, the default). Writes WORKDIR/card_claims.json (or
--json), a markdown table beside it and a PNG of validation NLL against epochs; finished
(seed, objective) curves are kept in WORKDIR/curves.json, so a cut-short study resumes.
Any --config.KEY=VALUE flag applies to every run (e.g. --config.train.weight_decay=0.3);
--runs picks the curves (ar and card always; card_half by default).
"""

from __future__ import annotations

import json
import sys
import sysconfig
import time
from pathlib import Path

import numpy as np

from benchmarks.common import announce, arg_parser

# name -> (objective, overrides): the curves every seed trains
RUNS = {"ar": ("ar", {}), "card": ("card", {}), "card_half": ("card", {"clean_fraction": 0.5})}
TIMED = ("ar", "card", "mdlm", "bd3lm")


def corpus_settings(corpus: str, validation_percent: int) -> tuple[str, dict]:
  """(data.dataset, data.options) of --corpus."""
  if corpus in ("", "python_stdlib"):
    return "python_stdlib", {}
  paths = (sysconfig.get_paths()["purelib"] + "/*.dist-info/METADATA",) \
      if corpus == "readmes" else tuple(p for p in corpus.split(",") if p)
  return "text_corpus", {"paths": paths, "validation_percent": validation_percent}


def study_config(args, overrides, objective: str, seed: int, **objective_fields):
  from cardjax.config import apply_overrides, load_config

  c = load_config("tiny_ar")
  c.name = f"card_claims_{objective}"
  c.seed = seed
  c.objective.name = objective
  for key, value in objective_fields.items():
    setattr(c.objective, key, value)
  c.model.hidden_size, c.model.num_layers = args.hidden, args.layers
  c.model.intermediate_size = 3 * args.hidden
  c.data.seq_len, c.data.batch_size = args.seq, args.batch
  c.data.data_dir = str(Path(args.workdir) / "data")
  c.data.dataset, c.data.options = corpus_settings(args.corpus, args.validation_percent)
  c.train.lr, c.train.warmup_steps = args.lr, args.warmup
  return apply_overrides(c, overrides)


def read_rows(config, split: str, max_tokens: int = 0, max_rows: int = 0) -> dict:
  """The split's packed rows in order, one pass, until max_tokens tokens (or max_rows
  rows) when given."""
  from cardjax.data.prepare import make_loader

  from benchmarks.studies.forked_wsd import KEYS

  rows, tokens = [], 0
  with make_loader(config, split=split, shuffle=False, num_epochs=1) as loader:
    for batch in loader:
      for i in range(len(batch["tokens"])):
        rows.append({k: np.asarray(batch[k][i]) for k in KEYS})
        tokens += int((rows[-1]["segment_ids"] > 0).sum())
        if (max_tokens and tokens >= max_tokens) or (max_rows and len(rows) >= max_rows):
          return {k: np.stack([r[k] for r in rows]) for k in KEYS}
  if not rows:
    raise SystemExit(f"the {split} split of {config.data.dataset} holds no rows")
  return {k: np.stack([r[k] for r in rows]) for k in KEYS}


def validation_batches(config, count: int) -> list[dict]:
  import jax.numpy as jnp

  rows = read_rows(config, config.data.eval_split, max_rows=count * config.data.batch_size)
  n = len(rows["tokens"]) // config.data.batch_size
  if n == 0:
    raise SystemExit(f"the {config.data.eval_split} split holds fewer than one batch of rows")
  b = config.data.batch_size
  return [{k: jnp.asarray(v[i * b:(i + 1) * b]) for k, v in rows.items()} for i in range(n)]


def _progress(label: str):
  from tqdm import tqdm

  bar = {}

  def update(done: int, total: int) -> None:
    if "bar" not in bar:
      bar["bar"] = tqdm(total=total, desc=label, unit="step", mininterval=10, leave=False)
    bar["bar"].update(done - bar["bar"].n)
    if done == total:
      bar["bar"].close()

  return update


def curves(args, overrides, lengths: dict[int, int], rows_arrays: dict, batches, seeds,
           cache: Path, per_seed_lengths=None) -> dict:
  """{run: [[nll per length] per seed]}, each (seed, run) trained once and kept in `cache`."""
  from benchmarks.studies.forked_wsd import Model, Rows, Schedule, train_lengths

  done = json.loads(cache.read_text()) if cache.exists() else {}
  runs = {name: RUNS[name] for name in args.runs.split(",")}
  out = {name: [] for name in runs}
  for seed in seeds:
    wanted = per_seed_lengths(seed) if per_seed_lengths else list(lengths)
    for name, (objective, fields) in runs.items():
      key = f"{name}/seed{seed}/" + ",".join(str(lengths[w]) for w in wanted)
      if key not in done:
        config = study_config(args, overrides, objective, seed, **fields)
        schedule = Schedule(config.train.lr, config.train.warmup_steps, args.decay_fraction,
                            config.train.min_lr_ratio)
        rows = Rows(rows_arrays, config.data.batch_size, seed)
        start = time.time()
        got = train_lengths(Model(config), rows, [lengths[w] for w in wanted], schedule,
                            batches, progress=_progress(f"seed {seed} {name}"))
        done[key] = [got[lengths[w]] for w in wanted]
        cache.write_text(json.dumps(done, indent=1) + "\n")
        print(f"   seed {seed} {name}: " + ", ".join(
            f"{w}: {v:.3f}" for w, v in zip(wanted, done[key])) +
            f" ({time.time() - start:.0f}s)", flush=True)
      by_length = dict(zip(wanted, done[key]))
      out[name].append([by_length.get(w) for w in lengths])
  return out


def main() -> None:
  parser = arg_parser(__spec__, __doc__)
  parser.add_argument("--corpus", default="python_stdlib",
                      help="a glob of text files (comma-separated globs), readmes, or "
                           "python_stdlib")
  parser.add_argument("--validation-percent", type=int, default=10)
  parser.add_argument("--tokens", type=int, default=None,
                      help="training tokens (the data-limited cap; default 40000, and the "
                           "whole split with --budgets); 0 = the whole split")
  parser.add_argument("--epochs", default="1,2,4,8,16,32,48")
  parser.add_argument("--budgets", default="",
                      help="one-pass budgets in steps (e.g. 600,2400,9600) instead of epochs")
  parser.add_argument("--seeds", default="0,1,2")
  parser.add_argument("--runs", default=",".join(RUNS),
                      help=f"the curves each seed trains, from {','.join(RUNS)} (ar and "
                           "card at least)")
  parser.add_argument("--hidden", type=int, default=128)
  parser.add_argument("--layers", type=int, default=4)
  parser.add_argument("--seq", type=int, default=128)
  parser.add_argument("--batch", type=int, default=8)
  parser.add_argument("--lr", type=float, default=3e-3)
  parser.add_argument("--warmup", type=int, default=20)
  parser.add_argument("--decay-fraction", type=float, default=0.2,
                      help="the share of each run that decays (warmup-stable-decay)")
  parser.add_argument("--eval-batches", type=int, default=16, help="validation batches")
  parser.add_argument("--time-rounds", type=int, default=5,
                      help="interleaved rounds of the train-step timing; 0 = skip it")
  parser.add_argument("--workdir", default="runs/card_claims")
  parser.add_argument("--json", default="", help="default WORKDIR/card_claims.json")
  args, overrides = parser.parse_known_args()
  bad = [o for o in overrides if not o.startswith("--config.")]
  if bad:
    parser.error(f"unknown arguments {bad}; config overrides look like --config.train.lr=1e-3")
  runs = args.runs.split(",")
  if not {"ar", "card"} <= set(runs) or not set(runs) <= set(RUNS):
    parser.error(f"--runs {args.runs!r}: name ar, card and any of {sorted(RUNS)}")
  from benchmarks.studies import card_claims_report as report

  machine = announce("card claims")
  workdir = Path(args.workdir)
  workdir.mkdir(parents=True, exist_ok=True)
  seeds = [int(s) for s in args.seeds.split(",")]
  config = study_config(args, overrides, "ar", seeds[0])
  from cardjax.data.prepare import prepare

  prepare(config)
  budgets = [int(b) for b in args.budgets.split(",") if b]
  cap = args.tokens if args.tokens is not None else (0 if budgets else 40_000)
  rows = read_rows(config, config.data.split, cap)
  batches = validation_batches(config, args.eval_batches)
  steps_per_epoch = len(rows["tokens"]) // args.batch
  result = {"corpus": args.corpus, "train_tokens": int((rows["segment_ids"] > 0).sum()),
            "train_rows": len(rows["tokens"]), "steps_per_epoch": steps_per_epoch,
            "validation_tokens": int(sum(int((b["segment_ids"] > 0).sum()) for b in batches)),
            "seeds": seeds,
            "model": {"hidden": args.hidden, "layers": args.layers, "seq": args.seq,
                      "batch": args.batch, "lr": args.lr, "warmup": args.warmup,
                      "decay_fraction": args.decay_fraction, "overrides": overrides},
            "machine": machine}
  print(f"   {args.corpus}: {result['train_tokens']:,} training tokens in "
        f"{result['train_rows']} rows ({steps_per_epoch} steps an epoch), "
        f"{result['validation_tokens']:,} validation tokens", flush=True)
  if budgets:
    lengths = {b: b for b in budgets}
    result["budgets"] = budgets
    result["epochs_of_data"] = [b / steps_per_epoch for b in budgets]
    result["val_nll"] = curves(args, overrides, lengths, rows, batches, seeds,
                               workdir / "curves_budgets.json",
                               lambda s: budgets if s == seeds[0] else budgets[:-1])
  else:
    epochs = [int(e) for e in args.epochs.split(",")]
    result["epochs"] = epochs
    lengths = {e: e * steps_per_epoch for e in epochs}
    result["val_nll"] = curves(args, overrides, lengths, rows, batches, seeds,
                               workdir / "curves.json")
  if args.time_rounds:
    from benchmarks.studies.card_claims_timing import step_times

    configs = {name: study_config(args, overrides, name, seeds[0]) for name in TIMED}
    result["step_time"] = step_times(configs, rows, args.time_rounds)
  report.summarise(result)
  out = Path(args.json) if args.json else workdir / "card_claims.json"
  out.parent.mkdir(parents=True, exist_ok=True)
  out.write_text(json.dumps(result, indent=1) + "\n")
  table = report.table(result)
  out.with_suffix(".md").write_text(table + "\n")
  print(table)
  picture = report.draw(result, out.with_suffix(".png"))
  print(f"   wrote {out}, {out.with_suffix('.md')}" + (f", {picture}" if picture else ""))


if __name__ == "__main__":
  sys.exit(main())
