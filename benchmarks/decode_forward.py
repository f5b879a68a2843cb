"""The cost of one decoding forward against the KV cache, by batch, new tokens and slots,
and what the MARS window decoder's pending-sized windows save over the 2B window.

  python -m benchmarks.decode_forward [--batches 1,4,16] [--tokens 1,8,16] [--slots 160,540]
      [--mars-batches 1,4] [--mars-taus 1,0.6,0] [--mars-block 4]

Every decoder's loop body is one `Decoder.forward_cached` call plus a little bookkeeping,
so this is what tokens per forward buys against: AR reads 1 new token per row, a MARS
window n + B (n pending tokens, "fit") or 2B ("full"), a CARD round B or 2B. Each cell is
the time of one forward inside a jitted fori_loop of 200 (no dispatch or sync per
forward), the fastest of 3, for the 128 x 4 layer model of configs/decode_bench.py (fp32).
Prints a table and the ratio of each cell to the first --tokens value (one token) at the
same batch and slots.

The MARS table decodes the same prompts with `mars.generate(window="full")` and
`window="fit"` (asserting the same tokens) and gives tokens/s of each, the fastest of 7
after a compile run, the two timed in turn. Its model is the same one initialised with
initializer_range 1.0: peaked random logits, so tau 0.6 accepts runs of 1..B tokens as a
trained model does (at the default 0.02 every confidence is about 1/vocab).
`--batches ""` skips the first table, `--mars-batches ""` the second.
"""

from __future__ import annotations

import dataclasses
import time

import numpy as np
from flax import nnx

from cardjax import machine
from cardjax.decoding import mars
from cardjax.decoding.frozen import freeze
from cardjax.model import ModelConfig, create_model

from benchmarks.common import arg_parser

CONFIG = ModelConfig(vocab_size=512, hidden_size=128, intermediate_size=384, num_layers=4,
                     num_heads=4, num_kv_heads=2, max_position_embeddings=1024,
                     tie_word_embeddings=True, mask_token_id=3)
LOOP = 200
MARS_PROMPTS, MARS_PROMPT_LEN, MARS_NEW = 8, 24, 64


def forward_ms(graphdef, state, batch: int, tokens: int, slots: int, repeats: int = 3,
               forwards: int = LOOP) -> float:
  """ms per cached forward of `tokens` new tokens after 40 cached: the best of `repeats`
  timings of a jitted loop of `forwards` forwards (benchmarks/forward_cost.py's loop)."""
  from cardjax.eval.forward_cost import forward_ms as loop_ms

  return loop_ms(graphdef, state, batch, tokens, slots, 40, forwards, repeats)


def mars_decode(model, prompts, batch: int, block: int, window: str, tau: float):
  """(rows, tokens, forwards summed over chunks, seconds) of MARS over `prompts` in chunks
  of `batch`."""
  start = time.perf_counter()
  rows, tokens, forwards = [], 0, 0
  for i in range(0, len(prompts), batch):
    out = mars.generate(model, prompts[i:i + batch], MARS_NEW, block=block, tau=tau,
                        mask_id=CONFIG.mask_token_id, window=window)
    rows += out.rows()
    tokens += int(out.lengths.sum())
    forwards += out.forwards
  return rows, tokens, forwards, time.perf_counter() - start


def mars_windows(scan: bool, block: int, batches: list[int], taus: list[float],
                 repeats: int = 7) -> None:
  cfg = dataclasses.replace(CONFIG, scan_layers=scan, initializer_range=1.0)
  model = freeze(create_model(cfg, seed=0))
  rng = np.random.default_rng(0)
  prompts = [rng.integers(4, cfg.vocab_size, MARS_PROMPT_LEN).tolist()
             for _ in range(MARS_PROMPTS)]
  print(f"\n== MARS window decoder, B = {block}: window n + B (fit) vs 2B (full), "
        f"{MARS_PROMPTS} prompts of {MARS_PROMPT_LEN} tokens, {MARS_NEW} new, the same tokens; "
        f"tokens/s the fastest of {repeats}, the two windows timed in turn")
  print("| batch | tau | tokens/forward | full: tokens/s | fit: tokens/s | fit / full |")
  print("|---|---|---|---|---|---|")
  for b in batches:
    for tau in taus:
      full_rows, tokens, forwards, _ = mars_decode(model, prompts, b, block, "full", tau)
      fit_rows, _, fit_forwards, _ = mars_decode(model, prompts, b, block, "fit", tau)
      assert fit_rows == full_rows and fit_forwards == forwards, (b, tau)
      best = {"full": float("inf"), "fit": float("inf")}
      for _ in range(repeats):  # alternate, so a slower spell of a shared machine hits both
        for window in best:
          best[window] = min(best[window],
                             mars_decode(model, prompts, b, block, window, tau)[3])
      per_forward = tokens / (forwards * b)  # a batched forward counts once per row
      print(f"| {b} | {tau} | {per_forward:.2f} | {tokens / best['full']:.0f} | "
            f"{tokens / best['fit']:.0f} | {best['full'] / best['fit']:.2f}x |", flush=True)


def forward_table(graphdef, state, args, slots: list[int]) -> None:
  print("| batch | new tokens | " + " | ".join(f"{s} slots" for s in slots) + " |")
  print("|---|---|" + "---|" * len(slots))
  for b in (int(x) for x in args.batches.split(",")):
    one = {}
    for t in (int(x) for x in args.tokens.split(",")):
      cells = []
      for s in slots:
        ms = forward_ms(graphdef, state, b, t, s)
        one.setdefault(s, ms)
        cells.append(f"{ms:.3f} ({ms / one[s]:.1f}x)")
      print(f"| {b} | {t} | " + " | ".join(cells) + " |", flush=True)


def main() -> None:
  parser = arg_parser(__spec__, __doc__)
  parser.add_argument("--batches", default="1,4,16")
  parser.add_argument("--tokens", default="1,8,16")
  parser.add_argument("--slots", default="160,540")
  parser.add_argument("--scan", action="store_true", help="scan over layers")
  parser.add_argument("--mars-batches", default="1,4")
  parser.add_argument("--mars-taus", default="1,0.6,0")
  parser.add_argument("--mars-block", type=int, default=4, help="the MARS B")
  args = parser.parse_args()
  cfg = dataclasses.replace(CONFIG, scan_layers=args.scan)
  graphdef, state = nnx.split(create_model(cfg, seed=0))
  slots = [int(s) for s in args.slots.split(",")]
  print(f"== decode forward: {machine.line()}, {'scanned' if args.scan else 'list'} layers; "
        "ms per forward (x one token)")
  if args.batches:
    forward_table(graphdef, state, args, slots)
  if args.mars_batches:
    mars_windows(args.scan, args.mars_block, [int(x) for x in args.mars_batches.split(",")],
                 [float(t) for t in args.mars_taus.split(",")])


if __name__ == "__main__":
  main()
