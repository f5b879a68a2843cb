"""The cost of one decoding forward against the KV cache, by batch, new tokens and slots.

  python benchmarks/decode_forward.py [--batches 1,4,16] [--tokens 1,8,16] [--slots 160,540]

Every decoder's loop body is one `Decoder.forward_cached` call plus a little bookkeeping,
so this is what tokens per forward buys against: AR reads 1 new token per row, a MARS
window 2B, a CARD round B or 2B. Each cell is the time of one forward inside a jitted
fori_loop of 200 (no dispatch or sync per forward), the fastest of 3, for the 128 x 4
layer model of configs/decode_bench.py (fp32). Prints a table and the ratio of each cell
to the first --tokens value (one token) at the same batch and slots.
"""

from __future__ import annotations

import argparse
import dataclasses
import platform
import time

import jax
import jax.numpy as jnp
from flax import nnx

from cardjax.model import ModelConfig, create_model
from cardjax.model.cache import KVCache

CONFIG = ModelConfig(vocab_size=512, hidden_size=128, intermediate_size=384, num_layers=4,
                     num_heads=4, num_kv_heads=2, max_position_embeddings=1024,
                     tie_word_embeddings=True, mask_token_id=3)
LOOP = 200


def forward_ms(graphdef, state, batch: int, tokens: int, slots: int, repeats: int = 3) -> float:
  @jax.jit
  def loop(state):
    model = nnx.merge(graphdef, state)
    cache = KVCache.create(model.cfg, batch, slots)
    pos = jnp.broadcast_to(40 + jnp.arange(tokens), (batch, tokens))
    seg = jnp.ones((batch, tokens), jnp.int32)

    def body(i, carry):
      cache, acc = carry
      cache = dataclasses.replace(cache, index=jnp.int32(40))  # same slots every time
      tok = jnp.full((batch, tokens), 7, jnp.int32) + i % 3
      logits, cache = model.forward_cached(tok, cache, positions=pos, segment_ids=seg)
      return cache, acc + logits[:, -1, 0].sum()

    return jax.lax.fori_loop(0, LOOP, body, (cache, jnp.float32(0)))[1]

  loop(state).block_until_ready()
  best = float("inf")
  for _ in range(repeats):
    start = time.perf_counter()
    loop(state).block_until_ready()
    best = min(best, time.perf_counter() - start)
  return best / LOOP * 1e3


def main() -> None:
  parser = argparse.ArgumentParser(description=__doc__,
                                   formatter_class=argparse.RawDescriptionHelpFormatter)
  parser.add_argument("--batches", default="1,4,16")
  parser.add_argument("--tokens", default="1,8,16")
  parser.add_argument("--slots", default="160,540")
  parser.add_argument("--scan", action="store_true", help="scan over layers")
  args = parser.parse_args()
  cfg = dataclasses.replace(CONFIG, scan_layers=args.scan)
  graphdef, state = nnx.split(create_model(cfg, seed=0))
  slots = [int(s) for s in args.slots.split(",")]
  print(f"== decode forward: {platform.processor() or platform.machine()}, "
        f"{jax.devices()[0].device_kind}, jax {jax.__version__}, "
        f"{'scanned' if args.scan else 'list'} layers; ms per forward (x one token)")
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


if __name__ == "__main__":
  main()
