"""AR and MARS on the same model, timed in alternation: a speedup that VM drift cannot fake.

  python -m benchmarks.studies.paired_timing --run runs/smollm2/mars --taus 0.95 --n 16 \
      --pairs 3

A shared VM's speed drifts by 10-30% over minutes, so two decoders timed one after the other
(as benchmarks.real_model and benchmarks.decode do, section by section) can differ by the
drift.
Here every round decodes the prompt set once with each decoder in turn (AR with a KV cache,
then MARS at each tau, then `--verify`), after a warm-up that compiles every shape; each
round gives one ratio per method, and the table reports the median ratio and its range over
rounds. The prompts are the first --n arith_sft test problems (built with the run's config:
set CARDJAX_DATA_DIR as for training).

`--forward-tokens 1,5,8` also times, in each round, a jitted loop of cached forwards of that
many new tokens (benchmarks.decode_forward's forward_ms): the cost of a multi-token
forward relative to a one-token one, measured next to the decodes whose speedup it predicts
(tokens/forward x ms(1) / ms(w)), since on a shared VM that ratio itself moves from run to
run.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import statistics
import time
from pathlib import Path

from cardjax import checkpoint
from cardjax.eval import inputs, measure, suite
from cardjax.decoding.methods import Options, make_decoder

from benchmarks import common
from benchmarks.common import arg_parser


def timed_pass(decode, chunks) -> tuple[float, int, int]:
  """(seconds, tokens, row-forwards) of one pass over the chunks."""
  start = time.perf_counter()
  rows, _, _, row_forwards = measure.one_pass(decode, chunks)  # the batch's: what it computes
  return time.perf_counter() - start, sum(len(r) for r in rows), row_forwards


FORWARD_SLOTS = 256


def spread(values: list[float], digits: int, unit: str = "") -> str:
  """'median [min-max]' of a method's values over rounds."""
  return common.spread(values, digits, unit, statistics.median)


def forward_summary(rounds: list[dict], methods, widths: list[int]) -> str:
  """Per method: the ms per row-forward its decode implies (prefill included) against AR's,
  beside the forward loop's ratio of each width to the first: where the two agree, a
  decoder's speedup is its tokens/forward over the forward-cost ratio, and the loop adds
  nothing of its own."""
  lines = ["\n| method | ms per row-forward in the decode, median [range] | x AR's, median "
           "[range] |", "|---|---|---|"]
  for name in methods:
    ms = [1e3 * rd[name]["seconds"] / max(1, rd[name]["row_forwards"]) for rd in rounds]
    ratio = [m / (1e3 * rd["ar"]["seconds"] / max(1, rd["ar"]["row_forwards"]))
             for m, rd in zip(ms, rounds)]
    lines.append(f"| {name} | {spread(ms, 1)} | {spread(ratio, 2, 'x')} |")
  lines += ["\n| new tokens | forward loop ms, median [range] | x one token, median [range] |",
            "|---|---|---|"]
  for w in widths:
    ms = [rd["forward_ms"][str(w)] for rd in rounds]
    ratio = [rd["forward_ms"][str(w)] / rd["forward_ms"][str(widths[0])] for rd in rounds]
    lines.append(f"| {w} | {spread(ms, 1)} | {spread(ratio, 2, 'x')} |")
  return "\n".join(lines)


def main() -> None:
  parser = arg_parser(__spec__, __doc__)
  parser.add_argument("--run", default="runs/smollm2/mars", help="a MARS-trained run")
  parser.add_argument("--taus", default="0.95")
  parser.add_argument("--verify", action=argparse.BooleanOptionalAction, default=True)
  parser.add_argument("--n", type=int, default=16)
  parser.add_argument("--batch", type=int, default=1)
  parser.add_argument("--pairs", type=int, default=3, help="rounds of alternation")
  parser.add_argument("--max-new-tokens", type=int, default=80)
  parser.add_argument("--out", default="", help="a JSON file for the rounds")
  parser.add_argument("--forward-tokens", default="",
                      help="e.g. 1,5,8: also time cached forwards of these widths each round")
  parser.add_argument("--forward-loop", type=int, default=50, help="forwards per timing")
  args = parser.parse_args()
  run = suite.load_run(args.run)
  config, tok, frozen = run.config, run.tokenizer, run.frozen
  step = checkpoint.latest_step(Path(args.run) / "checkpoints")
  prompts, _ = inputs.arith_problems(config, tok, args.n)
  opt = Options(max_new_tokens=args.max_new_tokens, stop_ids=tok.stop_ids, pad_id=tok.pad_id,
                block=int(config.objective.block_size))
  methods = {"ar": make_decoder("ar", frozen, "mars", opt)}
  for tau in (float(t) for t in args.taus.split(",")):
    methods[f"mars tau {tau}"] = make_decoder("mars", frozen, "mars",
                                              dataclasses.replace(opt, tau=tau))
  if args.verify:
    methods["mars --verify"] = make_decoder("mars", frozen, "mars",
                                            dataclasses.replace(opt, verify=True))
  info = common.announce()
  print(f"== {args.run} step {step}, {len(prompts)} problems, "
        f"batch {args.batch}, {args.pairs} rounds", flush=True)
  chunks = {name: measure.warm_up(d, prompts, args.batch) for name, d in methods.items()}
  widths = [int(t) for t in args.forward_tokens.split(",") if t]
  if widths:
    from benchmarks.decode_forward import forward_ms  # imports jax and the model

    def forward_table() -> dict[int, float]:
      return {w: forward_ms(frozen.graphdef, frozen.state, args.batch, w, FORWARD_SLOTS,
                            repeats=1, forwards=args.forward_loop) for w in widths}
    forward_table()  # compile every width before the first round
  rounds = []
  for r in range(args.pairs):
    got = {name: timed_pass(methods[name], chunks[name]) for name in methods}
    rounds.append({name: {"seconds": s, "tokens": t, "row_forwards": f}
                   for name, (s, t, f) in got.items()})
    ar_rate = got["ar"][1] / got["ar"][0]
    print(f"round {r + 1}: " + ", ".join(
        f"{name} {t / s:.1f} tok/s ({t / s / ar_rate:.2f}x)" for name, (s, t, _) in got.items()),
        flush=True)
    if widths:
      rounds[-1]["forward_ms"] = {str(w): ms for w, ms in forward_table().items()}
      one = rounds[-1]["forward_ms"][str(widths[0])]
      print("   forward ms: " + ", ".join(f"{w} tokens {ms:.1f} ({ms / one:.2f}x)"
                                         for w, ms in rounds[-1]["forward_ms"].items()),
            flush=True)
  print("\n| method | tokens/forward | tokens/s median [range] | x AR, median [range] of rounds |"
        "\n|---|---|---|---|")
  for name in methods:
    rates = [rd[name]["tokens"] / rd[name]["seconds"] for rd in rounds]
    ratios = [rate / (rd["ar"]["tokens"] / rd["ar"]["seconds"]) for rate, rd in zip(rates, rounds)]
    tpf = rounds[0][name]["tokens"] / max(1, rounds[0][name]["row_forwards"])
    print(f"| {name} | {tpf:.2f} | {spread(rates, 1)} | {spread(ratios, 2, 'x')} |")
  if widths:
    print(forward_summary(rounds, methods, widths))
  if args.out:
    Path(args.out).write_text(json.dumps({"machine": info, "args": vars(args),
                                          "rounds": rounds}, indent=1))


if __name__ == "__main__":
  main()
