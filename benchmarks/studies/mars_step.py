"""What a MARS train step costs against an AR (SFT) step on real SFT rows, with the full
noisy copy and with the compact noisy stream, timed in interleaved rounds.

  python -m benchmarks.studies.mars_step [--config configs/decode_bench.py:mars] \
      [--noisy-fraction 0.625] [--rounds 7] [--config.data.data_dir=...]

The rows are the config's own (its dataset, packing and seq_len); the compact stream keeps
the blocks whose outputs carry loss (docs/objectives.md), so --noisy-fraction must hold the
longest row's share: the study reads the first --scan rows, reports the largest share they
need, and refuses a fraction below it. Prints the median ratio to AR over the rounds with
its range, and the machine.
"""

from __future__ import annotations

import json

import numpy as np

from benchmarks.common import announce, arg_parser, range_cell


def needed_share(rows: dict, block: int) -> np.ndarray:
  """Per row: the share of the row in blocks that hold a loss-carrying output (the blocks
  the objective's compact stream keeps: cardjax.objectives.mars.loss_blocks)."""
  import jax

  from cardjax.objectives.base import next_token_targets
  from cardjax.objectives.mars import loss_blocks

  _, valid = next_token_targets(rows["tokens"], rows["segment_ids"], rows["loss_mask"])
  keep = jax.vmap(lambda p, g, w: loss_blocks(p, g, w, block))(
      rows["positions"], rows["segment_ids"], valid.astype(np.float32))
  return np.asarray(keep).mean(axis=1)


def main() -> None:
  parser = arg_parser(__spec__, __doc__)
  parser.add_argument("--config", default="configs/decode_bench.py:mars")
  parser.add_argument("--noisy-fraction", type=float, default=0.625)
  parser.add_argument("--rounds", type=int, default=7)
  parser.add_argument("--steps", type=int, default=5, help="steps per objective per round")
  parser.add_argument("--scan", type=int, default=2000, help="rows read for the needed share")
  parser.add_argument("--json", default="")
  args, overrides = parser.parse_known_args()
  from cardjax.config import load_config
  from cardjax.data.prepare import prepare

  from benchmarks.studies.card_claims import read_rows
  from benchmarks.studies.card_claims_timing import step_times

  machine = announce("mars step")
  # The full copy whatever the recipe sets (configs/decode_bench.py:mars is compact), so
  # that the two MARS runs differ in the stream alone.
  mars = load_config(args.config, overrides + ["--config.objective.noisy_fraction=1.0"])
  prepare(mars)
  rows = read_rows(mars, mars.data.split, max_rows=args.scan)
  need = needed_share(rows, mars.objective.block_size)
  if need.max() > args.noisy_fraction:
    raise SystemExit(f"--noisy-fraction {args.noisy_fraction} is below the {need.max():.3f} "
                     f"of a row the compact stream needs here; raise it")
  ar = load_config(args.config, overrides + ["--config.objective.name=ar"])
  compact = load_config(args.config, overrides + [
      f"--config.objective.noisy_fraction={args.noisy_fraction}"])
  ratios = (("mars_over_ar", "mars", "ar"), ("compact_over_ar", "compact", "ar"),
            ("compact_over_mars", "compact", "mars"))
  got = step_times({"ar": ar, "mars": mars, "compact": compact}, rows, args.rounds,
                   args.steps, ratios)
  result = {"config": args.config, "overrides": overrides,
            "noisy_fraction": args.noisy_fraction,
            "needed_share": {"mean": float(need.mean()), "max": float(need.max()),
                             "rows": len(need)},
            "step_time": got, "machine": machine}
  print(f"rows of {mars.data.seq_len} tokens, batch {mars.data.batch_size}: the compact "
        f"stream needs {need.mean():.3f} of a row on average, {need.max():.3f} at most "
        f"({len(need)} rows); noisy_fraction {args.noisy_fraction}")
  for label, _, _ in ratios:
    print(f"{label.replace('_over_', '/')}: " + range_cell(got[label], *got["spread"][label]) +
          f" (median [range] of {args.rounds} interleaved rounds)")
  if args.json:
    with open(args.json, "w") as f:
      f.write(json.dumps(result, indent=2) + "\n")


if __name__ == "__main__":
  main()
