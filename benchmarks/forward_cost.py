"""What a cached decoding forward costs on the device, by new tokens per row and batch: the
curve that says how much of a decoder's tokens per forward becomes speed.

  python -m benchmarks.forward_cost [--models smollm2_135m,qwen2_5_0_5b] [--tokens 1,2,4,8,16]
      [--batches 1,4,16,64] [--context 256] [--slots 512] [--json OUT.json] [--md OUT.md]

Every decoder's loop body is one `forward_cached` call: AR feeds 1 new token a row, a MARS
window n + B, a CARD round B or 2B. Each cell is one forward of `tokens` new tokens per row
against a cache of `slots` slots holding `context` tokens, timed inside a jitted fori_loop of
--forwards forwards (no dispatch or host sync per forward), the fastest of --repeats. The
models are the configs' shapes (SmolLM2-135M, Qwen2.5-0.5B) with random weights, bf16
weights and activations, layers scanned (the shape of the weights, not their values, sets
the cost). A cell's `vs_one_token` is its time over the 1-token cell of the same model and
batch; `tokens_per_ms` counts every new token of the forward. A decoder writing k tokens a
forward on average beats AR by about k / vs_one_token at its width.
"""

from __future__ import annotations

import dataclasses

from benchmarks.common import arg_parser
from cardjax.eval.forward_cost import forward_ms

COLUMNS = [("model", "model", ""), ("batch", "batch", "d"), ("tokens", "new tokens / row", "d"),
           ("ms", "ms / forward", ".3f"), ("vs_one_token", "x one token", ".2f"),
           ("tokens_per_ms", "new tokens / ms", ".1f")]


def model_shape(name: str, dtype: str):
  """A config's model (configs/NAME.py) as a scanned ModelConfig in `dtype`."""
  from cardjax.config import load_config, model_config

  cfg = model_config(load_config(name))
  return dataclasses.replace(cfg, dtype=dtype, param_dtype=dtype, scan_layers=True,
                             remat="none")


def main() -> None:
  parser = arg_parser(__spec__, __doc__)
  parser.add_argument("--models", default="smollm2_135m,qwen2_5_0_5b")
  parser.add_argument("--tokens", default="1,2,4,8,16")
  parser.add_argument("--batches", default="1,4,16,64")
  parser.add_argument("--context", type=int, default=256, help="tokens already in the cache")
  parser.add_argument("--slots", type=int, default=512)
  parser.add_argument("--dtype", default="bfloat16")
  parser.add_argument("--forwards", type=int, default=50, help="forwards per timed loop")
  parser.add_argument("--repeats", type=int, default=3)
  parser.add_argument("--budget-s", type=float, default=0.0,
                      help="start no new cell after this many seconds (0: no limit)")
  parser.add_argument("--smoke", action="store_true",
                      help="toy sizes for a CPU check of the output (the tiny config)")
  parser.add_argument("--json", default="forward_cost.json")
  parser.add_argument("--md", default=None, help="also append the table to this file")
  args = parser.parse_args()
  if args.smoke:
    args.models, args.tokens, args.batches = "tiny", "1,4", "1,2"
    args.context, args.slots, args.forwards, args.repeats = 8, 32, 4, 1
  models = [m for m in args.models.split(",") if m]
  tokens = [int(t) for t in args.tokens.split(",")]
  batches = [int(b) for b in args.batches.split(",")]

  from flax import nnx

  from cardjax.model import create_model, param_count

  from benchmarks.sections import Section

  sizes = {"models": models, "tokens": tokens, "batches": batches, "context": args.context,
           "slots": args.slots, "dtype": args.dtype, "layers": "scanned",
           "forwards_per_timing": args.forwards, "repeats": args.repeats,
           "timing": "best of repeats of one jitted fori_loop, divided by its forwards"}
  section = Section(args.json, args.md, "forward_cost",
                    "Forward cost on the device: ms per cached forward by new tokens and batch",
                    sizes, smoke=args.smoke, budget_s=args.budget_s)
  section.table(COLUMNS)
  try:
    for name in models:
      cfg = model_shape(name, args.dtype)
      model = create_model(cfg, seed=0)
      params = param_count(model)
      graphdef, state = nnx.split(model)
      del model
      for batch in batches:
        one = None
        for t in tokens:
          if section.over_budget():
            section.finish()
            return
          ms = forward_ms(graphdef, state, batch, t, args.slots, args.context,
                          args.forwards, args.repeats)
          one = ms if one is None else one
          section.row({"model": name, "params": params, "batch": batch, "tokens": t,
                       "ms": ms, "vs_one_token": ms / one,
                       "tokens_per_ms": batch * t / ms})
  except Exception as e:  # the JSON says what failed; the call goes on to the next section
    section.fail(e)
    raise
  section.finish()


if __name__ == "__main__":
  main()
