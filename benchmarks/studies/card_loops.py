"""Whether CARD's nested loops cost its forwards anything: CARD block decoding against two
bare loops of the same forwards, timed in turn, round after round, in one process.

  python -m benchmarks.studies.card_loops [--setting card-dus] [--batch 1] [--rounds 7]
      [--json OUT]

A CARD block runs one forward of 2B tokens ([previous block | block]) and then an inner
while loop of B-token forwards, inside the outer while loop over blocks
(decoding/card.py). On the decode benchmark's model (benchmarks/decode_overhead.py's Bench:
128 x 4 layers, peaked random weights, 24-token prompts), each round times:
  decoder  the CARD decoder of --setting at max_new_tokens 32 and 96 (best of 5 calls each);
  flat     decode_overhead's bare loops: one jitted loop of moving cached forwards per width,
           as many as the decoder ran of that width;
  nested   one jitted loop with CARD's structure and no decoding: per block a 2B-token
           forward at the block's cache index and positions, then a while loop of B-token
           forwards (DUS's rounds less one), in a while loop over the blocks.
Each figure is ms per forward from the difference of the two lengths (the fixed cost of a
call cancels). nested / flat near 1 means the loop structure is free and the decoder's
excess over nested is its own work between forwards (the planner, the logits it reads and
copies).
"""

from __future__ import annotations

import dataclasses
import statistics

from benchmarks.common import announce, arg_parser

LENGTHS = (32, 96)


def nested_loop(bench, batch: int, block: int, n: int, later: int):
  """(call, forwards): CARD's loop structure over ceil(n / block) blocks, each a 2B-token
  forward and then `later` B-token forwards in an inner while loop."""
  import jax
  import jax.numpy as jnp
  from flax import nnx

  from cardjax.model.cache import KVCache

  blocks, width = -(-n // block), bench.width
  slots = width + (blocks + 1) * block

  @jax.jit
  def run(state):
    model = nnx.merge(bench.graphdef, state)
    cache = KVCache.create(model.cfg, batch, slots)
    slot = jnp.arange(block)[None]

    def outer(carry):
      cache, blk, acc = carry
      start = jnp.broadcast_to(width + blk * block + slot, (batch, block))
      tok = jnp.full((batch, 2 * block), 7, jnp.int32)
      cache = dataclasses.replace(cache, index=width + blk * block)
      logits, cache = model.forward_cached(tok, cache,
                                           positions=jnp.concatenate([start - block, start], 1),
                                           segment_ids=jnp.ones_like(tok))

      def inner(carry):
        cache, r, acc = carry
        tok = jnp.full((batch, block), 7, jnp.int32) + r
        cache = dataclasses.replace(cache, index=width + (blk + 1) * block)
        more, cache = model.forward_cached(tok, cache, positions=start,
                                           segment_ids=jnp.ones_like(tok))
        return cache, r + 1, acc + more[:, -1, 0].sum()

      cache, _, acc = jax.lax.while_loop(lambda c: c[1] < later, inner,
                                         (cache, jnp.int32(0), acc + logits[:, -1, 0].sum()))
      return cache, blk + 1, acc

    return jax.lax.while_loop(lambda c: c[1] < blocks, outer,
                              (cache, jnp.int32(0), jnp.float32(0)))[2]

  return (lambda: run(bench.state)), blocks * (1 + later)


def main(argv: list[str] | None = None) -> None:
  parser = arg_parser(__spec__, __doc__)
  parser.add_argument("--setting", default="card-dus", choices=("card", "card-dus"))
  parser.add_argument("--batch", type=int, default=1)
  parser.add_argument("--rounds", type=int, default=7)
  parser.add_argument("--json", default=None)
  args = parser.parse_args(argv)

  from benchmarks import serve_overhead
  from benchmarks.decode_forward import CONFIG
  from benchmarks.decode_overhead import SETTINGS, Bench, cache_slots
  from cardjax.decoding.methods import Options, make_decoder
  from cardjax.eval.forward_cost import best_seconds, forward_loop

  info = announce(f"CARD's loops against flat and nested bare loops, {args.setting}, "
                  f"batch {args.batch}")
  bench = Bench(dataclasses.replace(CONFIG, initializer_range=1.0), LENGTHS, 5, 30)
  s = next(x for x in SETTINGS if x.key == args.setting)
  prompts = bench.prompts[:args.batch]
  opts = {n: Options(max_new_tokens=n, **s.options) for n in LENGTHS}
  decoders = {n: make_decoder(s.decoder, bench.frozen, s.objective, opts[n]) for n in LENGTHS}
  gens = {n: decoders[n](prompts) for n in LENGTHS}
  forwards = {n: gens[n].forwards for n in LENGTHS}
  block = opts[LENGTHS[0]].block
  flat, nested = {}, {}
  for n in LENGTHS:
    widths = bench.widths(s, opts[n], gens[n], prompts)
    flat[n] = [forward_loop(bench.graphdef, bench.state, args.batch, w,
                            cache_slots(s.key, opts[n], bench.width, n), bench.width, count,
                            moving=True) for w, count in widths.items()]
    # The nested loop runs the decoder's mean number of later forwards a block (DUS: all
    # blocks alike); with the confidence planner the count varies and is rounded.
    blocks = -(-n // block)
    nested[n], done = nested_loop(bench, args.batch, block, n,
                                  round(forwards[n] / blocks) - 1)
    assert done == forwards[n], (n, done, forwards[n])
  extra = forwards[LENGTHS[1]] - forwards[LENGTHS[0]]
  rounds = []
  print("| round | decoder ms / forward | flat | nested | decoder / flat | nested / flat |")
  print("|---|---|---|---|---|---|")
  for i in range(args.rounds):
    dec = {n: best_seconds(lambda n=n: decoders[n](prompts).tokens, 5) for n in LENGTHS}
    fl = {n: sum(best_seconds(run, 5) for run in flat[n]) for n in LENGTHS}
    ne = {n: best_seconds(nested[n], 5) for n in LENGTHS}
    d, f, e = ((t[LENGTHS[1]] - t[LENGTHS[0]]) / extra * 1e3 for t in (dec, fl, ne))
    rounds.append({"decoder_ms": d, "flat_ms": f, "nested_ms": e, "decoder_vs_flat": d / f,
                   "nested_vs_flat": e / f, "decoder_vs_nested": d / e})
    print(f"| {i} | {d:.3f} | {f:.3f} | {e:.3f} | {d / f:.2f} | {e / f:.2f} |", flush=True)
  summary = {k: statistics.median(r[k] for r in rounds)
             for k in ("decoder_vs_flat", "nested_vs_flat", "decoder_vs_nested")}
  print("medians: " + ", ".join(f"{k} {v:.2f}" for k, v in summary.items()))
  serve_overhead.write(args.json, {"machine": info, "setting": s.setting, "batch": args.batch,
                                   "forwards": forwards, "medians": summary, "rounds": rounds})


if __name__ == "__main__":
  main()
