"""`cardjax eval --harness arith_sft` against `cardjax eval --task arith` on the same
checkpoints, problems and decoding settings: the two must agree, problem by problem.

  python -m benchmarks.harness_agreement --run sft=runs/smollm2/seed0/sft \
      --run mars=runs/smollm2/seed0/mars --settings sft:ar,mars:ar,mars:0.95,mars:0.9,mars:verify \
      --n 128 --batch 16 --max-new-tokens 80 --out results/eval/harness_agreement.json

A setting is RUN:ar, RUN:TAU (MARS threshold decoding) or RUN:verify (self-verified MARS).
Both sides run in this process through `cardjax.cli.main`, one after the other, with the
chat template (the arith prompts are chat-rendered on both). For each setting the table
gives each side's exact match and tokens per forward, and how many problems have the same
completion (the harness cuts its text at the task's `until` strings, which are the
tokenizer's stop tokens here, so the texts compare whole) and the same verdict.
"""

from __future__ import annotations

import json
import os
import tempfile
from pathlib import Path

from benchmarks.common import announce, arg_parser


def _flags(setting: str) -> list[str]:
  if setting == "ar":
    return ["--method", "ar"]
  if setting == "verify":
    return ["--method", "mars", "--verify"]
  return ["--method", "mars", "--tau", setting]


def _eval_arith(run: str, setting: str, args, out: Path) -> dict:
  from cardjax.cli import main

  code = main(["eval", "--checkpoint", run, "--task", "arith", "--n", str(args.n),
               "--batch", str(args.batch), "--max-new-tokens", str(args.max_new_tokens),
               *(["--data-dir", args.data_dir] if args.data_dir else []), *_flags(setting),
               "--out", str(out)])
  assert code == 0, f"cardjax eval --task arith exited {code}"
  entry = json.loads(out.read_text())["runs"][0]
  return {"exact_match": entry["metrics"]["exact_match"],
          "tokens_per_forward": entry["metrics"]["tokens_per_forward"],
          "texts": [e["generation"] for e in entry["examples"]],
          "correct": [bool(e["correct"]) for e in entry["examples"]]}


def _harness(run: str, setting: str, args, out: Path) -> dict:
  from cardjax.cli import main

  code = main(["eval", "--checkpoint", run, "--harness", "arith_sft", "--limit", str(args.n),
               "--batch-size", str(args.batch), "--apply-chat-template", "--gen-kwargs",
               f"max_gen_toks={args.max_new_tokens}", "--bootstrap-iters", "0",
               "--log-samples", *_flags(setting), "--output", str(out)])
  assert code == 0, f"cardjax eval --harness exited {code}"
  data = json.loads(out.read_text())
  result = data["results"]["arith_sft"]
  samples = {}
  for s in data["samples"]["arith_sft"]:
    if s.get("filter") in (None, "strict-match"):
      samples[s["doc_id"]] = s
  ordered = [samples[i] for i in sorted(samples)]
  return {"exact_match": result["exact_match,strict-match"],
          "flexible": result["exact_match,flexible-extract"],
          "tokens_per_forward": result["cardjax"]["generate_until"]["tokens_per_forward"],
          "texts": [s["resps"][0][0] for s in ordered],
          "correct": [bool(s["exact_match"]) for s in ordered]}


def main():
  parser = arg_parser(__spec__, __doc__)
  parser.add_argument("--run", action="append", required=True, metavar="NAME=PATH")
  parser.add_argument("--settings", required=True, help="NAME:ar|TAU|verify, comma-separated")
  parser.add_argument("--n", type=int, default=128)
  parser.add_argument("--batch", type=int, default=16)
  parser.add_argument("--max-new-tokens", type=int, default=80)
  parser.add_argument("--data-dir", default=os.environ.get("CARDJAX_DATA_DIR", ""))
  parser.add_argument("--out", default="")
  args = parser.parse_args()
  runs = dict(r.split("=", 1) for r in args.run)
  machine = announce("harness agreement")
  rows = []
  with tempfile.TemporaryDirectory(prefix="cardjax-agree-") as tmp:
    for item in args.settings.split(","):
      name, setting = item.split(":", 1)
      ours = _eval_arith(runs[name], setting, args, Path(tmp) / f"{item}.eval.json")
      harness = _harness(runs[name], setting, args, Path(tmp) / f"{item}.harness.json")
      same_text = sum(a.strip() == b.strip() for a, b in zip(ours["texts"], harness["texts"],
                                                            strict=True))
      same_verdict = sum(a == b for a, b in zip(ours["correct"], harness["correct"],
                                                strict=True))
      rows.append({"model": name, "checkpoint": runs[name], "setting": setting,
                   "eval_arith": {k: ours[k] for k in ("exact_match", "tokens_per_forward")},
                   "harness": {k: harness[k] for k in ("exact_match", "flexible",
                                                       "tokens_per_forward")},
                   "same_completion": same_text, "same_verdict": same_verdict, "n": args.n})
      print(json.dumps(rows[-1]), flush=True)
  print("\n| model | setting | eval --task arith: exact match, tokens/forward | --harness "
        "arith_sft: strict, flexible, tokens/forward | same completion | same verdict |")
  print("|---|---|---|---|---|---|")
  for r in rows:
    e, h = r["eval_arith"], r["harness"]
    print(f"| {r['model']} | {r['setting']} | {e['exact_match']:.1%}, "
          f"{e['tokens_per_forward']:.2f} | {h['exact_match']:.1%}, {h['flexible']:.1%}, "
          f"{h['tokens_per_forward']:.2f} | {r['same_completion']}/{r['n']} | "
          f"{r['same_verdict']}/{r['n']} |")
  if args.out:
    Path(args.out).parent.mkdir(parents=True, exist_ok=True)
    Path(args.out).write_text(json.dumps({"machine": machine, "n": args.n, "batch": args.batch,
                                          "max_new_tokens": args.max_new_tokens,
                                          "rows": rows}, indent=1) + "\n")
    print(f"wrote {args.out}")


if __name__ == "__main__":
  main()
