"""What the rotary embedding costs a cached forward whose positions are known only at run time.

  python -m benchmarks.studies.rope_cost [--shapes 1x1,1x9,4x5,16x1,16x5,16x9] [--rounds 12]
      [--json OUT]

Each shape BxW is a jitted loop of 48 cached forwards of W new tokens on B rows of the
decode benchmark's model (benchmarks/decode_forward.py's CONFIG, 128 x 4 layers) against a
136-slot cache, its write index and positions alternating between two values the loop
computes (as a decoder's are: not constants XLA can fold). Two builds of the same model
run in turn, the fastest of --rounds timings each: `tables`, rope.rope_factors as the model
has it (cos and sin from two small tables read by one-hot matmuls), and `angles`, the
rotary factors computed as cos and sin of positions x frequencies, as the model did before
2026-12-07; XLA:CPU fuses the latter into every consumer that rotates q or k and evaluates
them per element of each head and half.
"""

from __future__ import annotations

import dataclasses
import time

from benchmarks.common import announce, arg_parser

FORWARDS, SLOTS, CONTEXT = 48, 136, 32


def from_angles(positions, inv_freq, limit=None):
  """The rotary factors computed from their angles (the former way)."""
  import jax.numpy as jnp

  angles = positions[..., None].astype(jnp.float32) * jnp.asarray(inv_freq, jnp.float32)
  return jnp.cos(angles)[:, :, None, :], jnp.sin(angles)[:, :, None, :]


def loop(graphdef, state, batch: int, width: int):
  """A jitted loop of FORWARDS cached forwards with run-time positions and write index."""
  import jax
  import jax.numpy as jnp
  from flax import nnx

  from cardjax.model.cache import KVCache

  @jax.jit
  def run(state):
    model = nnx.merge(graphdef, state)
    cache = KVCache.create(model.cfg, batch, SLOTS)

    def body(i, carry):
      cache, acc = carry
      at = CONTEXT + i % 2
      pos = jnp.broadcast_to(at + jnp.arange(width), (batch, width))
      cache = dataclasses.replace(cache, index=jnp.int32(at))
      tok = jnp.full((batch, width), 7, jnp.int32) + i % 3
      logits, cache = model.forward_cached(tok, cache, positions=pos,
                                           segment_ids=jnp.ones((batch, width), jnp.int32))
      return cache, acc + logits[:, -1, 0].astype(jnp.float32).sum()

    return jax.lax.fori_loop(0, FORWARDS, body, (cache, jnp.float32(0)))[1]

  return lambda: run(state)


def main(argv: list[str] | None = None) -> None:
  parser = arg_parser(__spec__, __doc__)
  parser.add_argument("--shapes", default="1x1,1x9,4x5,16x1,16x5,16x9")
  parser.add_argument("--rounds", type=int, default=12)
  parser.add_argument("--json", default=None)
  args = parser.parse_args(argv)
  import jax
  from flax import nnx

  import cardjax.model.attention as attention
  from benchmarks import serve_overhead
  from benchmarks.decode_forward import CONFIG
  from cardjax.model import create_model

  info = announce("rotary embedding in a cached forward, run-time positions")
  graphdef, state = nnx.split(create_model(dataclasses.replace(CONFIG, initializer_range=1.0),
                                           seed=0))
  tables = attention.rope_factors
  rows = []
  print("| rows x new tokens | tables ms / forward | angles ms / forward | tables / angles |")
  print("|---|---|---|---|")
  for shape in args.shapes.split(","):
    batch, width = (int(v) for v in shape.split("x"))
    runs = {}
    for name, rope in (("tables", tables), ("angles", from_angles)):
      attention.rope_factors = rope  # read when the loop is traced, just below
      runs[name] = loop(graphdef, state, batch, width)
      jax.block_until_ready(runs[name]())
    attention.rope_factors = tables
    best = dict.fromkeys(runs, float("inf"))
    for _ in range(args.rounds):
      for name, run in runs.items():
        start = time.perf_counter()
        jax.block_until_ready(run())
        best[name] = min(best[name], (time.perf_counter() - start) / FORWARDS * 1e3)
    rows.append({"batch": batch, "width": width, "tables_ms": best["tables"],
                 "angles_ms": best["angles"], "ratio": best["tables"] / best["angles"]})
    r = rows[-1]
    print(f"| {batch} x {width} | {r['tables_ms']:.3f} | {r['angles_ms']:.3f} | "
          f"{r['ratio']:.2f} |", flush=True)
  serve_overhead.write(args.json, {"machine": info, "rounds": args.rounds, "rows": rows})


if __name__ == "__main__":
  main()
