"""The decode section of the prepared GPU call: AR with a KV cache against MARS, self-verified
MARS, CARD blocks and DUS, on the device, from a bench pack trained on a CPU.

  python -m benchmarks.decode_device [--pack runs/bench_pack] [--batches 1,4,16]
      [--json OUT.json] [--md OUT.md]

The pack is what `make bench-pack` writes (benchmarks/pack_runs.py: the decode benchmark's
runs, params only, with their tokenizers and the prompt sets as ids). arith: the SFT model
as AR against its MARS fine-tune at tau 1 / 0.95 / 0.9, each with the pending-sized window,
the 2B window and the block-level cache, and self-verified MARS; exact match on the test problems
(the first 64 of the 128 the CPU benchmark reads). code (when the pack has the ar and card
runs, and time remains): AR against CARD blocks (confidence planner over tau, left to
right), DUS, EB and CB; NLL of the continuation under the AR model. Every row is timed
paired with AR, round by round, at the same batch (cardjax/eval/measure.py): `speedup` is
the median of the rounds' ratios, with their range.
`ms_per_forward` is a pass's time over its batched forwards (the loop's overhead included).
"""

from __future__ import annotations

import sys
from pathlib import Path

from benchmarks.common import arg_parser

COLUMNS = [("task", "task", ""), ("model", "model", ""), ("method", "method", ""),
           ("setting", "setting", ""), ("batch", "batch", "d"),
           ("tokens_per_forward", "tokens / forward", ".2f"),
           ("ms_per_forward", "ms / forward", ".3f"), ("tokens_per_second", "tokens/s", ",.0f"),
           ("speedup_cell", "speedup vs AR", ""), ("quality", "quality", ""),
           ("equals_ar", "= AR tokens", "")]
PACKS = ("runs/bench_pack", "results/bench_pack")
SMOKE = {"no_full_window": True, "batches": "2", "taus": "1.0,0.9", "card_taus": "0.9",
         "code_batches": "2", "n_arith": 4, "n_code": 2, "repeats": 1, "min_seconds": 0.0,
         "max_new_arith": 8, "max_new_code": 8}


def find_pack(given: str | None) -> Path:
  for candidate in ([given] if given else PACKS):
    path = Path(candidate)
    if (path / "inputs.json").is_file() and (path / "runs").is_dir():
      return path
  raise SystemExit(f"no bench pack at {given or ' or '.join(PACKS)}: `make bench-pack` writes "
                   "runs/bench_pack (carry it), or pass --pack DIR")


def with_cells(row: dict) -> dict:
  """The table's derived cells: ms per forward, the speedup with its range, the quality."""
  seconds = row["tokens"] / max(row["tokens_per_second"], 1e-9)
  out = dict(row, ms_per_forward=1e3 * seconds / max(row["forwards"], 1))
  # AR's own rows are the reference: speedup 1, no rounds to pair.
  low, high = out.setdefault("speedup_range", [row["speedup"], row["speedup"]])
  out["speedup_cell"] = f"{row['speedup']:.2f}x [{low:.2f}-{high:.2f}]"
  if "exact_match" in row:
    out["quality"] = f"EM {100 * row['exact_match']:.1f}%"
  else:
    out["quality"] = f"NLL {row['judge_nll']:.3f}"
  return out


def summarise(rows: list[dict]) -> dict:
  """Per batch: AR's tokens/s, and each MARS setting at tau 0.95 and --verify against it."""
  out = {}
  for r in rows:
    key = None
    if r["task"] == "arith" and r["method"] == "mars" and r["setting"].startswith("tau=0.95"):
      key = f"arith batch {r['batch']} MARS {r['setting']}"
    elif r["method"] == "mars --verify":
      key = f"arith batch {r['batch']} MARS --verify"
    elif r["task"] == "code" and (r["method"] == "dus"
                                  or r["setting"].startswith("confidence tau=0.7")):
      key = f"code batch {r['batch']} {r['model']} {r['method']} {r['setting']}"
    if key:
      out[key] = (f"{r['speedup_cell']} at {r['tokens_per_forward']:.2f} tokens/forward, "
                  f"{r['quality']}")
  return out


def main() -> None:
  parser = arg_parser(__spec__, __doc__)
  parser.add_argument("--pack", default=None, help=f"a bench pack (default: {' or '.join(PACKS)})")
  parser.add_argument("--batches", default="1,4,16")
  parser.add_argument("--taus", default="1.0,0.95,0.9")
  parser.add_argument("--card-taus", default="0.9,0.7,0.5")
  parser.add_argument("--code-batches", default="4,16,1",
                      help="batches of the code rows, in order, while the budget lasts")
  parser.add_argument("--n-arith", type=int, default=64,
                      help="arith test problems (the CPU benchmark's first 64 of its 128)")
  parser.add_argument("--n-code", type=int, default=32)
  parser.add_argument("--repeats", type=int, default=3)
  parser.add_argument("--min-seconds", type=float, default=0.2)
  parser.add_argument("--no-full-window", action="store_true",
                      help="leave out MARS's 2B-window rows (on an accelerator a forward "
                           "costs about the same at any width, and the pending-sized window "
                           "pays a loop per width: the rows say which wins there)")
  parser.add_argument("--max-new-arith", type=int, default=96)
  parser.add_argument("--max-new-code", type=int, default=64)
  parser.add_argument("--budget-s", type=float, default=0.0,
                      help="start no new batch after this many seconds (0: no limit)")
  parser.add_argument("--smoke", action="store_true",
                      help="few prompts, short outputs: a CPU check of the section's output")
  parser.add_argument("--json", default="decode.json")
  parser.add_argument("--md", default=None)
  if "--smoke" in sys.argv:  # toy defaults; flags given beside --smoke still win
    parser.set_defaults(**SMOKE)
  args = parser.parse_args()
  pack = find_pack(args.pack)

  import json

  from cardjax.eval import suite

  from benchmarks.sections import Section

  inputs = json.loads((pack / "inputs.json").read_text())
  names = [n for n in ("sft", "mars", "ar", "card") if (pack / "runs" / n / "checkpoints").is_dir()]
  sizes = {"pack": str(pack), "runs": names, "batches": [int(b) for b in args.batches.split(",")],
           "taus": [float(t) for t in args.taus.split(",")], "block": 4, "cache_block": 16,
           "n_arith": args.n_arith, "max_new_arith": args.max_new_arith,
           "code_batches": [int(b) for b in args.code_batches.split(",") if b],
           "card_taus": [float(t) for t in args.card_taus.split(",")], "card_block": 8,
           "n_code": args.n_code, "max_new_code": args.max_new_code,
           "repeats": args.repeats, "min_seconds": args.min_seconds,
           "timing": "each row paired with AR round by round; tokens/s the median pass"}
  section = Section(args.json, args.md, "decode",
                    "Decode on the device: MARS, self-verified MARS, CARD and DUS against AR",
                    sizes, smoke=args.smoke, budget_s=args.budget_s)
  section.table(COLUMNS)

  def on_row(row):
    section.row(with_cells(row))

  try:
    if {"sft", "mars"} <= set(names):
      sft, mars = (suite.load_run(pack / "runs" / n) for n in ("sft", "mars"))
      arith = {k: v[:args.n_arith] for k, v in inputs["arith"].items()}
      for batch in sizes["batches"]:
        if section.over_budget():
          break
        suite.arith_rows(sft, mars, arith, [batch], sizes["taus"], block=4, cache_block=16,
                         max_new_tokens=args.max_new_arith, log=lambda _: None,
                         repeats=args.repeats, min_seconds=args.min_seconds,
                         full_window=not args.no_full_window, on_row=on_row)
    else:
      section.note(f"the pack at {pack} has no sft and mars runs: no arith rows")
    if {"ar", "card"} <= set(names) and "code" in inputs:
      ar, card = (suite.load_run(pack / "runs" / n) for n in ("ar", "card"))
      code = {"prompts": inputs["code"]["prompts"][:args.n_code]}
      for batch in sizes["code_batches"]:
        if section.over_budget():
          break
        suite.code_rows(ar, {"card": card}, None, code, [batch], sizes["card_taus"], block=8,
                        max_new_tokens=args.max_new_code, log=lambda _: None,
                        repeats=args.repeats, min_seconds=args.min_seconds, on_row=on_row)
    else:
      section.note(f"the pack at {pack} has no ar and card runs: no code rows")
  except Exception as e:
    section.fail(e)
    raise
  section.finish(**summarise(section.data["rows"]))


if __name__ == "__main__":
  main()
