"""What a forward with a few new tokens costs on this CPU, matmul by matmul, under each of
XLA:CPU's matmul libraries.

  python -m benchmarks.studies.cpu_matmul [--tokens 1,4,8,16] [--repeats 5]

A MARS forward reads M = 4-9 tokens where an AR step reads one. At M = 1 a layer's matmuls
are vector-matrix products, bound by reading the weights; at M = 8 they do 8x the FLOPs on
the same weights, so on a processor that multiplies fast enough the forward should cost
about what M = 1 costs. This times the matmuls of SmolLM2-135M's 30 decoder layers (q, k, v,
o, gate, up, down; fp32; no attention, norms or LM head) in one jitted function for each M,
once per XLA:CPU setting (each in its own process, since XLA_FLAGS is read at start-up, run
from the same working directory, the repo root):
XLA's default (profiled in docs/real_model.md: Eigen's matrix-vector kernel at M = 1,
YNNPACK for M > 1), Eigen for every dot (YNNPACK fusion off), XNNPACK and YNNPACK dot
fusions, oneDNN, and single-threaded Eigen.
It prints ms per forward (median and range of --repeats timings of 20 calls), the ratio to
M = 1 and the GFLOP/s reached. A setting this jaxlib does not know is reported, not fatal.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import time

from benchmarks.common import arg_parser

SETTINGS = {
    "XLA's default": "",
    "eigen for every dot": "--xla_cpu_experimental_ynn_fusion_type=",
    "xnnpack dots": "--xla_cpu_experimental_xnn_fusion_type=LIBRARY_FUSION_TYPE_DOT",
    "ynnpack dots": "--xla_cpu_experimental_ynn_fusion_type=LIBRARY_FUSION_TYPE_DOT",
    "onednn": "--xla_cpu_use_onednn=true",
    "eigen, 1 thread": "--xla_cpu_multi_thread_eigen=false",
}
# SmolLM2-135M: width 576, 9 query / 3 kv heads of 64, MLP 1536, 30 layers.
WIDTH, KV, MLP, LAYERS = 576, 192, 1536, 30
SHAPES = [(WIDTH, WIDTH), (WIDTH, KV), (WIDTH, KV), (WIDTH, WIDTH),
          (WIDTH, MLP), (WIDTH, MLP), (MLP, WIDTH)]


def measure(tokens: list[int], repeats: int) -> dict:
  """{M: [ms per forward, one per repeat]} in this process (its XLA_FLAGS)."""
  import jax
  import jax.numpy as jnp

  key = jax.random.key(0)
  weights = [[jax.random.normal(jax.random.fold_in(key, 10 * i + j), s, jnp.float32) * 0.02
              for j, s in enumerate(SHAPES)] for i in range(LAYERS)]

  @jax.jit
  def forward(x, weights):
    for q, k, v, o, gate, up, down in weights:
      attn = (x @ q) + jnp.tile(x @ k + x @ v, (1, WIDTH // KV))  # stands in for attention
      x = x + attn @ o
      x = x + (jax.nn.silu(x @ gate) * (x @ up)) @ down
    return x

  out = {}
  for m in tokens:
    x = jnp.ones((m, WIDTH), jnp.float32)
    forward(x, weights).block_until_ready()
    times = []
    for _ in range(repeats):
      start = time.perf_counter()
      for _ in range(20):
        y = forward(x, weights)
      y.block_until_ready()
      times.append((time.perf_counter() - start) / 20 * 1e3)
    out[m] = times
  return out


def main() -> None:
  parser = arg_parser(__spec__, __doc__)
  parser.add_argument("--tokens", default="1,4,8,16")
  parser.add_argument("--repeats", type=int, default=5)
  parser.add_argument("--child", action="store_true", help=argparse.SUPPRESS)
  args = parser.parse_args()
  tokens = [int(t) for t in args.tokens.split(",")]
  if args.child:
    print(json.dumps(measure(tokens, args.repeats)))
    return

  from benchmarks.common import announce, range_cell

  announce()
  flops = {m: 2 * m * LAYERS * sum(a * b for a, b in SHAPES) for m in tokens}
  print(f"== {LAYERS} layers of SmolLM2-135M's matmuls, fp32, "
        f"{4 * LAYERS * sum(a * b for a, b in SHAPES) / 1e6:.0f} MB of weights\n")
  print("| XLA:CPU setting | " + " | ".join(f"M={m}: ms [range], x M=1, GFLOP/s" for m in tokens)
        + " |\n|---|" + "---|" * len(tokens))
  for name, flags in SETTINGS.items():
    env = dict(os.environ, XLA_FLAGS=(os.environ.get("XLA_FLAGS", "") + " " + flags).strip())
    proc = subprocess.run([sys.executable, "-m", "benchmarks.studies.cpu_matmul", "--child",
                           "--tokens", args.tokens, "--repeats", str(args.repeats)],
                          env=env, capture_output=True, text=True)
    if proc.returncode != 0:
      why = (proc.stderr.strip().splitlines() or ["no output"])[-1][:100]
      print(f"| {name} | not available in this jaxlib: {why} |", flush=True)
      continue
    got = {int(m): t for m, t in json.loads(proc.stdout.strip().splitlines()[-1]).items()}
    one = statistics.median(got[tokens[0]])
    cells = []
    for m in tokens:
      med = statistics.median(got[m])
      cells.append(f"{range_cell(med, min(got[m]), max(got[m]), 1)}, {med / one:.2f}x, "
                   f"{flops[m] / med / 1e6:.1f}")
    print(f"| {name} | " + " | ".join(cells) + " |", flush=True)


if __name__ == "__main__":
  main()
