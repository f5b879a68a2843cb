"""AR and MARS on the same model, timed in alternation: a speedup that VM drift cannot fake.

  python benchmarks/paired_timing.py --run runs/smollm2/mars --taus 0.95 --n 16 --pairs 3

A shared VM's speed drifts by 10-30% over minutes, so two decoders timed one after the other
(as benchmarks/real_model.py and decode.py do, section by section) can differ by the drift.
Here every round decodes the prompt set once with each decoder in turn (AR with a KV cache,
then MARS at each tau, then `--verify`), after a warm-up that compiles every shape; each
round gives one ratio per method, and the table reports the median ratio and its range over
rounds. The prompts are the first --n arith_sft test problems (built with the run's config:
set CARDJAX_DATA_DIR as for training).
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import statistics
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from cardjax import checkpoint, machine  # noqa: E402
from cardjax.decoding import evaluate, suite  # noqa: E402
from cardjax.decoding.methods import Options, make_decoder  # noqa: E402


def timed_pass(decode, chunks) -> tuple[float, int, int]:
  """(seconds, tokens, row-forwards) of one pass over the chunks."""
  start = time.perf_counter()
  rows, _, row_forwards = evaluate.one_pass(decode, chunks)
  return time.perf_counter() - start, sum(len(r) for r in rows), row_forwards


def main() -> None:
  parser = argparse.ArgumentParser(description=__doc__,
                                   formatter_class=argparse.RawDescriptionHelpFormatter)
  parser.add_argument("--run", default="runs/smollm2/mars", help="a MARS-trained run")
  parser.add_argument("--taus", default="0.95")
  parser.add_argument("--verify", action=argparse.BooleanOptionalAction, default=True)
  parser.add_argument("--n", type=int, default=16)
  parser.add_argument("--batch", type=int, default=1)
  parser.add_argument("--pairs", type=int, default=3, help="rounds of alternation")
  parser.add_argument("--max-new-tokens", type=int, default=80)
  parser.add_argument("--out", default="", help="a JSON file for the rounds")
  args = parser.parse_args()
  run = suite.load_run(args.run)
  config, tok, frozen = run.config, run.tokenizer, run.frozen
  step = checkpoint.latest_step(Path(args.run) / "checkpoints")
  prompts, _ = evaluate.arith_problems(config, tok, args.n)
  opt = Options(max_new_tokens=args.max_new_tokens, stop_ids=tok.stop_ids, pad_id=tok.pad_id,
                block=int(config.objective.block_size))
  methods = {"ar": make_decoder("ar", frozen, "mars", opt)}
  for tau in (float(t) for t in args.taus.split(",")):
    methods[f"mars tau {tau}"] = make_decoder("mars", frozen, "mars",
                                              dataclasses.replace(opt, tau=tau))
  if args.verify:
    methods["mars --verify"] = make_decoder("mars", frozen, "mars",
                                            dataclasses.replace(opt, verify=True))
  info = machine.describe()
  print(f"== {machine.line(info)}\n== {args.run} step {step}, {len(prompts)} problems, "
        f"batch {args.batch}, {args.pairs} rounds", flush=True)
  chunks = {name: evaluate.warm_up(d, prompts, args.batch) for name, d in methods.items()}
  rounds = []
  for r in range(args.pairs):
    got = {name: timed_pass(methods[name], chunks[name]) for name in methods}
    rounds.append({name: {"seconds": s, "tokens": t, "row_forwards": f}
                   for name, (s, t, f) in got.items()})
    ar_rate = got["ar"][1] / got["ar"][0]
    print(f"round {r + 1}: " + ", ".join(
        f"{name} {t / s:.1f} tok/s ({t / s / ar_rate:.2f}x)" for name, (s, t, _) in got.items()),
        flush=True)
  print("\n| method | tokens/forward | tokens/s median [range] | x AR, median [range] of rounds |"
        "\n|---|---|---|---|")
  for name in methods:
    rates = [rd[name]["tokens"] / rd[name]["seconds"] for rd in rounds]
    ratios = [rate / (rd["ar"]["tokens"] / rd["ar"]["seconds"]) for rate, rd in zip(rates, rounds)]
    tpf = rounds[0][name]["tokens"] / max(1, rounds[0][name]["row_forwards"])
    print(f"| {name} | {tpf:.2f} | {statistics.median(rates):.1f} [{min(rates):.1f}-"
          f"{max(rates):.1f}] | {statistics.median(ratios):.2f}x [{min(ratios):.2f}-"
          f"{max(ratios):.2f}] |")
  if args.out:
    Path(args.out).write_text(json.dumps({"machine": info, "args": vars(args),
                                          "rounds": rounds}, indent=1))


if __name__ == "__main__":
  main()
