"""The flash-decoding kernel (cardjax/attention/pallas_decode.py) against xla's
cache_attention: the cached forwards of decoding, in one run.

  python -m benchmarks.attention_decode [--slots 1024,4096,16384] [--out FILE]

Everywhere: the kernel's largest error against cache_attention on a small cache (interpret
mode off GPU). On a GPU only: the median time of one attention call (one layer) for an AR
step (1 query, causal), a MARS window (4 pending + 4 masks, dual stream) and a 512-token
prefill (causal), over a cache of --slots slots filled to --fill of them per row, batch
--batch, with the kernel's tokens/s-relevant figure: the GB/s of k and v actually read
(the written slots). cache_attention reads every slot, written or not; the kernel stops at
each row's last written tile.
"""

from __future__ import annotations


import numpy as np

from benchmarks.common import Tee, announce, arg_parser, timed

CASES = {  # name: (mask kind, block, queries)
    "AR step": ("causal", 0, 1),
    "MARS window B=4": ("dual_stream", 4, 8),
    "prefill 512": ("causal", 0, 512),
}


def inputs(kind, block, tq, b, h, kvh, d, slots, fill, dtype):
  """q over a cache whose rows hold `fill` written slots (positions 0..fill-1, segment 1),
  the rest unwritten (segment -1); the queries come after them, as decoding's do."""
  import jax
  import jax.numpy as jnp

  from cardjax.attention import CLEAN, NOISY, MaskSpec

  spec = MaskSpec(kind, block) if block else MaskSpec(kind)
  keys = jax.random.split(jax.random.key(0), 3)
  q = jax.random.normal(keys[0], (b, tq, h, d), dtype)
  k = jax.random.normal(keys[1], (b, kvh, slots, d), dtype)
  v = jax.random.normal(keys[2], (b, kvh, slots, d), dtype)
  written = np.arange(slots) < fill
  k_meta = (jnp.asarray(np.broadcast_to(np.where(written, np.arange(slots), 0), (b, slots)),
                        jnp.int32),
            jnp.full((b, slots), CLEAN, jnp.int32),
            jnp.asarray(np.broadcast_to(np.where(written, 1, -1), (b, slots)), jnp.int32))
  if kind == "dual_stream":  # pending clean tokens then the masks at the next positions
    half = tq // 2
    pos = np.concatenate([fill - half + np.arange(half), fill + np.arange(half)])
    streams = np.array([CLEAN] * half + [NOISY] * half)
  else:
    pos, streams = fill - tq + np.arange(tq), np.full(tq, CLEAN)
  q_meta = tuple(jnp.asarray(np.broadcast_to(x, (b, tq)), jnp.int32)
                 for x in (pos, streams, np.ones(tq)))
  return spec, q, k, v, q_meta, k_meta


def main() -> None:
  parser = arg_parser(__spec__, __doc__)
  parser.add_argument("--slots", default="1024,4096,16384")
  parser.add_argument("--fill", type=float, default=0.5, help="written share of the slots")
  parser.add_argument("--batch", type=int, default=16)
  parser.add_argument("--heads", type=int, default=16)
  parser.add_argument("--kv-heads", type=int, default=4)
  parser.add_argument("--head-dim", type=int, default=128)
  parser.add_argument("--out", default=None, help="also append every line to this file")
  args = parser.parse_args()

  import jax
  import jax.numpy as jnp

  from cardjax.attention import cache_attention
  from cardjax.attention.pallas_decode import pallas_decode_attention

  report = Tee(args.out)  # appends to --out
  on_gpu = jax.default_backend() == "gpu"
  announce("decode-kernel benchmark", report)
  worst = 0.0
  for name, (kind, block, tq) in CASES.items():  # small, float32: the error check
    spec, q, k, v, qm, km = inputs(kind, block, min(tq, 16), 2, 4, 2, 64, 200, 120,
                                   jnp.float32)
    got = jax.jit(lambda q, k, v, qm, km, spec=spec: pallas_decode_attention(
        q, k, v, spec, qm, km, interpret=not on_gpu))(q, k, v, qm, km)
    want = cache_attention(q, k, v, spec, qm, km)
    worst = max(worst, float(jnp.max(jnp.abs(got - want))))
  report(f"largest |kernel - cache_attention| (float32, {'GPU' if on_gpu else 'interpret'}): "
         f"{worst:.2e}")
  if worst > 1e-3:
    raise SystemExit("the kernel disagrees with cache_attention: no timings")
  if not on_gpu:
    report("(no GPU: timings need jax.default_backend() == 'gpu'; see "
           "benchmarks/attention_gpu.sh)")
    return
  b, h, kvh, d = args.batch, args.heads, args.kv_heads, args.head_dim
  report(f"\nbatch {b}, heads {h}/{kvh}, head_dim {d}, bf16, {args.fill:.0%} of the slots "
         "written\n\n| case | slots | cache_attention ms | kernel ms | speedup | kernel GB/s "
         "of written k,v |\n|---|---|---|---|---|---|")
  for slots in (int(s) for s in args.slots.split(",")):
    fill = int(slots * args.fill)
    for name, (kind, block, tq) in CASES.items():
      spec, q, k, v, qm, km = inputs(kind, block, tq, b, h, kvh, d, slots, fill,
                                     jnp.bfloat16)
      xla = timed(jax.jit(lambda q, k, v, qm, km, spec=spec: cache_attention(
          q, k, v, spec, qm, km)), q, k, v, qm, km, repeats=10)
      kern = timed(jax.jit(lambda q, k, v, qm, km, spec=spec: pallas_decode_attention(
          q, k, v, spec, qm, km)), q, k, v, qm, km, repeats=10)
      read = 2 * b * kvh * fill * d * 2  # k and v, bf16
      report(f"| {name} | {slots} | {xla * 1e3:.3f} | {kern * 1e3:.3f} | {xla / kern:.2f}x | "
             f"{read / kern / 1e9:.0f} |")


if __name__ == "__main__":
  main()
