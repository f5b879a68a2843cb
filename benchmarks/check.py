"""Re-run the small recorded decode benchmark and check it lands inside the recorded spread.

  python -m benchmarks.check                      # make bench-check
  python -m benchmarks.check --record             # after a run: record its results
  python -m benchmarks.check --compare RECORDED NEW   # two results.json, no run

`--compare` judges any two results.json of `benchmarks.decode` the same way (e.g. the code
table in results/decode/code_2400_2026-12-03_run1.json against its second run, _run2.json).

The recorded run is results/decode/bench_check.json: the results.json of `benchmarks.decode` with
CHECK_ARGS (arith only, 3 training seeds, batch 1). The check trains and decodes the same
command in --workdir (a fresh one unless it holds finished runs) and compares every row
(benchmarks/recorded.py): quality within the seeds' range, tokens per forward within
10%, and the speedup within its timing range on a processor of the recorded model (on
another it is printed, not judged). Exits 1 when a row is outside.
"""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
from pathlib import Path

from benchmarks import recorded
from benchmarks.common import ROOT, arg_parser

RECORD = ROOT / "results" / "decode" / "bench_check.json"
CHECK_ARGS = ["--code-models", "", "--batches", "1", "--taus", "1.0,0.95", "--n-arith", "64",
              "--seeds", "0,1,2", "--repeats", "3"]


def main() -> None:
  parser = arg_parser(__spec__, __doc__)
  parser.add_argument("--workdir", default="runs/bench_check")
  parser.add_argument("--record", action="store_true",
                      help="copy WORKDIR/results.json to results/decode/bench_check.json, "
                           "check nothing")
  parser.add_argument("--compare", nargs=2, metavar=("RECORDED", "NEW"),
                      help="compare two results.json files, run nothing")
  parser.add_argument("--quality-slack", type=float, default=0.05)
  args = parser.parse_args()
  if args.compare:
    for path in args.compare:
      if not Path(path).is_file():
        raise SystemExit(f"{path} is missing: --compare takes two results.json files of "
                         f"benchmarks.decode")
    judge(*(json.loads(Path(p).read_text()) for p in args.compare), args.quality_slack)
  results = Path(args.workdir) / "results.json"
  if args.record:
    if not results.is_file():
      raise SystemExit(f"{results} is missing: run `python -m benchmarks.check` (or "
                       f"python -m benchmarks.decode {' '.join(map(repr, CHECK_ARGS))}) first")
    shutil.copy2(results, RECORD)
    print(f"recorded {results} as {RECORD}")
    return
  # From the working directory (the repo root), where --workdir is relative to.
  subprocess.run([sys.executable, "-m", "benchmarks.decode", "--workdir", args.workdir,
                  *CHECK_ARGS], check=True)
  if not RECORD.is_file():
    raise SystemExit(f"{RECORD} is missing: nothing recorded to check against; record this "
                     f"run with `python -m benchmarks.check --workdir {args.workdir} --record`")
  judge(json.loads(RECORD.read_text()), json.loads(results.read_text()), args.quality_slack)


def judge(recorded_run: dict, new_run: dict, quality_slack: float) -> None:
  """Print the row-by-row verdicts and exit 1 when a row is outside the recorded spread."""
  verdicts = recorded.compare(recorded_run, new_run, quality_slack=quality_slack)
  print(recorded.report(verdicts))
  sys.exit(0 if all(v.ok for v in verdicts) else 1)


if __name__ == "__main__":
  main()
