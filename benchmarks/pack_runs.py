"""Copy what `python -m benchmarks.decode --no-train` reads from a bench workdir, and nothing
else.

  python -m benchmarks.pack_runs runs/bench_decode runs/bench_pack [--runs sft,mars]

For each run (every training seed's): its latest step's params, model config and run
config (no optimizer state, no data iterator), and its tokenizer in checkpoints/hf_assets;
then inputs.json (the prompt sets as ids). The copy is a few MB per small model, so it
travels to a machine that has no datasets (or another Python, whose stdlib corpus
differs), e.g. a GPU box:

  python -m benchmarks.decode --workdir runs/bench_pack --no-train
"""

from __future__ import annotations

import json
import os
import shutil
from pathlib import Path

from cardjax import checkpoint

from benchmarks.common import arg_parser

# The items of a training step that restore_model and read_run_config read.
ITEMS = ("params", "model_config", "config")


def portable(step_dir: Path) -> None:
  """Leave no path of this machine in a packed step: the run config's absolute local paths
  (data.data_dir, train.init_from, ...) become "" (the loading machine's defaults; a
  packed run is only decoded, never resumed), and orbax's commit markers, which name the
  folder they were written to, say only that the commit succeeded."""
  meta = step_dir / "config" / "metadata"
  if meta.is_file():
    config = json.loads(meta.read_text())

    def clear(section):
      for key, value in section.items():
        if isinstance(value, dict):
          clear(value)
        elif isinstance(value, str) and os.path.isabs(os.path.expanduser(value)):
          section[key] = ""

    clear(config)
    meta.write_text(json.dumps(config))
  for marker in step_dir.rglob("commit_success.txt"):
    marker.write_text("Checkpoint commit was successful.")


def pack_run(run: Path, out: Path) -> int:
  """Copy one run's latest step (ITEMS only) and tokenizer; returns the step."""
  src = run / "checkpoints"
  step = checkpoint.latest_step(src)
  dst = out / "checkpoints"
  if dst.exists():
    shutil.rmtree(dst)
  (dst / str(step)).mkdir(parents=True)
  for entry in (src / str(step)).iterdir():
    if entry.is_file():  # orbax's step metadata and commit marker
      shutil.copy2(entry, dst / str(step) / entry.name)
    elif entry.name in ITEMS:
      shutil.copytree(entry, dst / str(step) / entry.name)
  portable(dst / str(step))
  if (src / checkpoint.ASSETS).is_dir():
    shutil.copytree(src / checkpoint.ASSETS, dst / checkpoint.ASSETS)
  else:  # a run from before the trainer kept its tokenizer with the checkpoints
    from cardjax.config import merge_into_base
    from cardjax.data.prepare import tokenizer_source
    checkpoint.copy_assets(dst, tokenizer_source(merge_into_base(
        checkpoint.read_run_config(src, step))))
  return step


def main() -> None:
  parser = arg_parser(__spec__, __doc__)
  parser.add_argument("workdir", type=Path, help="a benchmarks.decode workdir")
  parser.add_argument("out", type=Path)
  parser.add_argument("--runs", default="",
                      help="only these seed-0 runs (e.g. sft,mars: what the GPU call's arith "
                           "rows read); default every run of every seed")
  args = parser.parse_args()
  only = [n for n in args.runs.split(",") if n]
  inputs = args.workdir / "inputs.json"
  if not inputs.is_file():
    raise SystemExit(f"{inputs} is missing: run python -m benchmarks.decode on "
                     f"{args.workdir} first (it saves the prompt sets there)")
  args.out.mkdir(parents=True, exist_ok=True)
  shutil.copy2(inputs, args.out / "inputs.json")
  # Seed 0's runs in runs/NAME, other training seeds' in runs/seedS/NAME (common.run_dir).
  runs_dir = args.workdir / "runs"
  found = [runs_dir / n for n in only] if only else [*runs_dir.iterdir(),
                                                     *runs_dir.glob("seed*/*")]
  missing = [str(p) for p in found if only and not (p / "checkpoints").is_dir()]
  if missing:
    raise SystemExit(f"--runs: no trained run at {', '.join(missing)}")
  for run in sorted(p for p in found if (p / "checkpoints").is_dir()):
    name = run.relative_to(runs_dir)
    step = pack_run(run, args.out / "runs" / name)
    print(f"packed {name} step {step}")
  size = sum(f.stat().st_size for f in args.out.rglob("*") if f.is_file())
  print(f"{args.out}: {size / 2**20:.1f} MiB")


if __name__ == "__main__":
  main()
