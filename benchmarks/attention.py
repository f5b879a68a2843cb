"""Attention patterns: skipped tiles, and the block-sparse Pallas GPU kernel against cuDNN.

  python -m benchmarks.attention [--lengths 512,2048,8192] [--tiles 128,512]
  python -m benchmarks.attention --kernel [--out FILE]       # + the kernel sections below

Tile table (always; machine independent): for each cardjax mask pattern, one training row of
L data tokens laid out as the objective lays it out (MARS and BD3LM read 2L tokens: two
streams), classified tile by tile with the mask predicate (cardjax/attention/tiles.py): the
share of EMPTY tiles (skipped), and of FULL ones (no mask work).

With --kernel:
  * the kernel's own device tables (cardjax/attention/pallas_gpu.py: tile_classes from
    per-tile metadata bounds, the tables the kernel really walks) at its default tiles
    (forward 128 x 64, backward 64 x 64) for the same rows: skipped / FULL shares;
  * a max-error table of the kernel against the dense reference (output, dq, dk, dv) at
    small sizes: in interpret mode on CPU, compiled on a GPU (the same kernel code);
  * on a GPU only (jax.default_backend() == 'gpu'): forward and forward+backward times of
    the kernel, cuDNN with the dense mask (jax.nn.dot_product_attention(implementation=
    'cudnn', mask=...)) and cuDNN causal (is_causal=True) over the same row, for the causal,
    packed and MARS dual-stream patterns at --gpu-lengths; TFLOP/s count only the visible
    (query, key) pairs of each pattern (4 d flops per pair forward, 14 d forward+backward,
    per head); the ratios are the kernel's speedup over cuDNN with the mask and its useful
    TFLOP/s as a share of cuDNN causal's useful TFLOP/s. Targets: MARS >= 2x the masked
    cuDNN at L >= 4096 and >= 60% of cuDNN causal's useful TFLOP/s.
Rows are printed (and appended to --out) as they finish, so a run cut short keeps them;
--budget-s stops starting new GPU rows after that many seconds.
"""

from __future__ import annotations

import sys
import time

import numpy as np

from cardjax.attention import MaskSpec
from cardjax.attention.tiles import FULL, row_layout, skipped_fraction, tile_table

from benchmarks.common import Tee, arg_parser, timed

# (name, mask, layout kind, packed documents)
PATTERNS = [("causal (AR, CARD)", MaskSpec("causal"), "causal", 1),
            ("causal, 4 packed documents", MaskSpec("causal"), "causal", 4),
            ("bidirectional (MDLM)", MaskSpec("bidirectional"), "bidirectional", 1),
            ("MARS dual stream, B = 4", MaskSpec("dual_stream", 4), "dual_stream", 1),
            ("BD3LM, B = 16", MaskSpec("bd3lm", 16), "bd3lm", 1),
            ("block causal, B = 16", MaskSpec("block_causal", 16), "block_causal", 1)]
# The patterns timed on a GPU: (name, mask, layout kind, packed documents).
GPU_PATTERNS = [("MARS dual stream, B = 4", MaskSpec("dual_stream", 4), "dual_stream", 1),
                ("causal, 4 packed documents", MaskSpec("causal"), "causal", 4),
                ("causal (AR, CARD)", MaskSpec("causal"), "causal", 1)]


def host_tile_table(report, lengths, tiles) -> None:
  report("skipped tiles (full tiles), per pattern, row length L and square tile size\n")
  report("| pattern | " + " | ".join(f"L={n}, tile {t}" for n in lengths for t in tiles)
         + " |\n|---|" + "---|" * (len(lengths) * len(tiles)))
  for name, spec, kind, docs in PATTERNS:
    cells = []
    for n in lengths:
      meta = row_layout(kind, n, documents=docs)
      for t in tiles:
        table = tile_table(spec, meta, meta, t, t)
        cells.append(f"{100 * skipped_fraction(table):.1f}% ({100 * (table == FULL).mean():.1f}%)")
    report(f"| {name} | " + " | ".join(cells) + " |")


def batched_meta(kind, length, documents, batch=1):
  import jax.numpy as jnp
  return tuple(jnp.asarray(np.repeat(np.asarray(x, np.int32)[None], batch, 0))
               for x in row_layout(kind, length, documents=documents))


def kernel_tables(report, lengths) -> None:
  """Skip / FULL shares of the tables the kernel walks (device pre-pass, default tiles)."""
  from cardjax.attention import pallas_gpu as pg
  report("\nkernel tables (device pre-pass from metadata bounds): skipped (FULL) tiles, "
         f"forward {pg.BLOCK_Q}x{pg.BLOCK_K} | backward {pg.BWD_BLOCK_Q}x{pg.BWD_BLOCK_K}\n")
  report("| pattern | " + " | ".join(f"L={n} fwd | L={n} bwd" for n in lengths)
         + " |\n|---|" + "---|---|" * len(lengths))
  for name, spec, kind, docs in PATTERNS:
    cells = []
    for n in lengths:
      meta = batched_meta(kind, n, docs)
      for bq, bk in ((pg.BLOCK_Q, pg.BLOCK_K), (pg.BWD_BLOCK_Q, pg.BWD_BLOCK_K)):
        f = pg.visit_fractions(pg.tile_classes(spec, meta, meta, bq, bk))
        cells.append(f"{100 * f['skipped']:.1f}% ({100 * f['full']:.1f}%)")
    report(f"| {name} | " + " | ".join(cells) + " |")


def error_table(report, length: int, interpret: bool, patterns=PATTERNS) -> float:
  """Max |kernel - reference| of output and gradients per pattern; returns the worst."""
  import jax.numpy as jnp

  from cardjax.attention import pallas_gpu as pg

  mode = "interpret mode" if interpret else "compiled"
  tiles = "16 x 16 tiles" if interpret else "default tiles"
  report(f"\nkernel vs dense reference ({mode}, {tiles}), L={length}, float32, 4 heads / "
         "2 kv heads, d=64; loss weights 0 on rows with no visible key\n")
  # Interpret mode runs short rows: 16 x 16 tiles give them several tiles per side.
  tile = 16 if interpret else None
  return _errors(report, length, patterns, jnp.float32, relative=False,
                 kernel=lambda q, k, v, spec, meta: pg.pallas_gpu_attention(
                     q, k, v, spec, meta, meta, interpret=interpret, block_q=tile,
                     block_k=tile))


def hopper_errors(report, length: int, interpret: bool, patterns=PATTERNS,
                  backward: str = "mosaic") -> float:
  """The Hopper kernels (attention_impl=pallas_mgpu: pallas_mgpu.py's forward and, with
  backward="mosaic", pallas_mgpu_bwd.py's gradients; "triton": pallas_gpu's) against the
  dense reference per pattern: bf16 inputs (their only kind), 4 heads / 2 kv heads, d=64;
  max |error| over output and gradients relative to the largest reference entry. Returns
  the worst."""
  import jax.numpy as jnp

  from cardjax.attention import pallas_gpu as pg

  report(f"\nHopper forward, {backward} backward vs dense reference "
         f"({'interpret mode' if interpret else 'compiled'}), L={length}, bfloat16 inputs, "
         "4 heads / 2 kv heads, d=64; error relative to the largest reference entry\n")
  return _errors(report, length, patterns, jnp.bfloat16, relative=True,
                 kernel=lambda q, k, v, spec, meta: pg.pallas_gpu_attention(
                     q, k, v, spec, meta, meta, interpret=interpret, forward="mosaic",
                     backward=backward))


def _errors(report, length: int, patterns, dtype, relative: bool, kernel) -> float:
  """The error table of `kernel(q, k, v, spec, meta)` against the dense reference (on the
  same values in float32): per pattern the max |error| of the output (on rows that see a
  key: the kernels return 0 on the others) and of dq, dk, dv, each divided by the largest
  reference entry when `relative`. Returns the worst."""
  import jax
  import jax.numpy as jnp

  from cardjax.attention import dense_mask, reference_attention

  report("| pattern | output | dq | dk | dv |\n|---|---|---|---|---|")
  worst = 0.0
  for name, spec, kind, docs in patterns:
    meta = batched_meta(kind, length, docs)
    t = meta[0].shape[1]
    keys = jax.random.split(jax.random.key(0), 4)
    q = jax.random.normal(keys[0], (1, t, 4, 64), dtype)
    k, v = (jax.random.normal(x, (1, t, 2, 64), dtype) for x in keys[1:3])
    seen = dense_mask(spec, meta, meta).any(-1)[:, :, None, None]  # rows with a visible key
    w = jax.random.normal(keys[3], q.shape) * seen

    def run(fn, *args):
      def loss(q, k, v):
        out = fn(q, k, v).astype(jnp.float32)
        return jnp.sum(out * w), out
      (_, out), grads = jax.jit(jax.value_and_grad(loss, argnums=(0, 1, 2), has_aux=True))(
          *args)
      return [np.asarray(x, np.float32) for x in (out, *grads)]

    got = run(lambda q, k, v: kernel(q, k, v, spec, meta), q, k, v)
    with jax.default_matmul_precision("highest"):
      ref = run(lambda q, k, v: reference_attention(q, k, v, spec, meta, meta),
                *(x.astype(jnp.float32) for x in (q, k, v)))
    rows = np.asarray(seen, np.float32)
    pairs = [(got[0] * rows, ref[0] * rows), *zip(got[1:], ref[1:])]
    errs = [float(np.abs(a - b).max() / (np.abs(b).max() if relative else 1.0))
            for a, b in pairs]
    worst = max(worst, *errs)
    report(f"| {name} | " + " | ".join(f"{e:.1e}" for e in errs) + " |")
  return worst


def visible_pairs(spec, meta) -> int:
  """Visible (query, key) pairs of one row, counted in chunks of queries (no T x T array)."""
  pos, streams, seg = (np.asarray(x)[0] for x in meta)
  total = 0
  for s in range(0, len(pos), 1024):
    sl = slice(s, s + 1024)
    total += int(spec.allowed(pos[sl, None], pos[None], streams[sl, None], streams[None],
                              seg[sl, None], seg[None]).sum())
  return total


def gpu_timings(report, lengths, heads: int, kv_heads: int, head_dim: int, tokens: int,
                budget_s: float, patterns=GPU_PATTERNS, on_row=None, smoke: bool = False,
                hopper: str | None = None) -> None:
  """The timing table; on_row(dict) gets each row's figures. smoke: the same table on a CPU
  at toy sizes (the kernel in interpret mode at 16 x 16 tiles, XLA's attention in place of
  cuDNN), so the code that writes it is exercised where there is no GPU. hopper: a column
  for the Hopper forward with this backward ("mosaic": attention_impl=pallas_mgpu;
  "triton": pallas_gpu's backward kernels), or None."""
  import jax
  import jax.numpy as jnp

  from cardjax.attention import dense_mask
  from cardjax.attention import pallas_gpu as pg

  start = time.perf_counter()
  report(f"\nGPU timings: {jax.devices()[0].device_kind}, jax {jax.__version__}, bfloat16, "
         f"{heads} heads / {kv_heads} kv heads, d={head_dim}, batch = max(1, {tokens} // T); "
         "ms (useful TFLOP/s)\n")
  extra = " Hopper kernel | Hopper share of causal |" if hopper else ""
  report("| pattern | L | T | pass | kernel | cuDNN + mask | cuDNN causal | "
         f"speedup vs masked | share of causal TFLOP/s |{extra}\n"
         "|---|---|---|---|---|---|---|---|---|" + ("---|---|" if hopper else ""))
  impl = "xla" if smoke else "cudnn"
  tile = 16 if smoke else None
  for name, spec, kind, docs in patterns:
    for length in lengths:
      if time.perf_counter() - start > budget_s:
        report(f"(stopped: --budget-s {budget_s:.0f} s spent; rows after this were not run)")
        return
      meta = batched_meta(kind, length, docs)
      t = meta[0].shape[1]
      batch = max(1, tokens // t)
      meta = tuple(jnp.repeat(x, batch, 0) for x in meta)
      keys = jax.random.split(jax.random.key(length), 3)
      q = jax.random.normal(keys[0], (batch, t, heads, head_dim), jnp.bfloat16)
      k, v = (jax.random.normal(x, (batch, t, kv_heads, head_dim), jnp.bfloat16)
              for x in keys[1:])
      pairs = visible_pairs(spec, meta) * batch
      causal_pairs = t * (t + 1) // 2 * batch
      mask = dense_mask(spec, meta, meta)[:, None]  # [b, 1, T, T] for cuDNN

      # Metadata and mask are arguments, not constants baked into the programs (the mask
      # is up to 1 GiB, and the kernel's table pre-pass must be timed, not folded).
      fns = {"kernel": (lambda q, k, v, m: pg.pallas_gpu_attention(
                 q, k, v, spec, m, m, interpret=smoke, block_q=tile, block_k=tile), meta),
             "masked": (lambda q, k, v, m: jax.nn.dot_product_attention(
                 q, k, v, mask=m, implementation=impl), mask),
             "causal": (lambda q, k, v, m: jax.nn.dot_product_attention(
                 q, k, v, is_causal=True, implementation=impl), None)}
      if hopper:
        fns["hopper"] = (lambda q, k, v, m: pg.pallas_gpu_attention(
            q, k, v, spec, m, m, interpret=smoke, forward="mosaic", backward=hopper), meta)
      for label, flops_per_pair in (("fwd", 4), ("fwd+bwd", 14)):
        cells = {}
        for key, (fn, aux) in fns.items():
          if label == "fwd":
            step = jax.jit(fn)
          else:
            step = jax.jit(jax.grad(lambda q, k, v, m, fn=fn: fn(q, k, v, m).astype(
                jnp.float32).sum(), argnums=(0, 1, 2)))
          try:
            cells[key] = timed(step, q, k, v, aux)
          except Exception as e:  # noqa: BLE001  one failed baseline must not end the table
            report(f"({name}, L={length}, {label}, {key}: failed: {type(e).__name__}: "
                   f"{str(e).splitlines()[0][:200] if str(e) else ''})")
            cells[key] = float("nan")
        useful = flops_per_pair * head_dim * heads
        tf = {key: useful * (causal_pairs if key == "causal" else pairs) / s / 1e12
              for key, s in cells.items()}
        report(f"| {name} | {length} | {t} | {label} | "
               + " | ".join(f"{1e3 * cells[x]:.2f} ({tf[x]:.0f})"
                            for x in ("kernel", "masked", "causal"))
               + f" | {cells['masked'] / cells['kernel']:.2f}x"
               + f" | {100 * tf['kernel'] / tf['causal']:.0f}% |"
               + (f" {1e3 * cells['hopper']:.2f} ({tf['hopper']:.0f}) | "
                  f"{100 * tf['hopper'] / tf['causal']:.0f}% |" if hopper else ""))
        if on_row:
          on_row({"pattern": name, "length": length, "tokens": t, "batch": batch,
                  "pass": label, "kernel_ms": 1e3 * cells["kernel"],
                  "cudnn_masked_ms": 1e3 * cells["masked"],
                  "cudnn_causal_ms": 1e3 * cells["causal"], "kernel_tflops": tf["kernel"],
                  "cudnn_masked_tflops": tf["masked"], "cudnn_causal_tflops": tf["causal"],
                  "speedup_vs_masked": cells["masked"] / cells["kernel"],
                  "share_of_causal": tf["kernel"] / tf["causal"],
                  **({"hopper_ms": 1e3 * cells["hopper"], "hopper_tflops": tf["hopper"],
                      "hopper_share_of_causal": tf["hopper"] / tf["causal"]}
                     if hopper else {})})


def main() -> None:
  parser = arg_parser(__spec__, __doc__)
  parser.add_argument("--lengths", default="512,2048,8192")
  parser.add_argument("--tiles", default="128,512")
  parser.add_argument("--kernel", action="store_true",
                      help="also the kernel's tables, its error table and (on a GPU) timings")
  parser.add_argument("--check-length", type=int, default=None,
                      help="L of the error table (default 48 in interpret mode, 1024 on GPU)")
  parser.add_argument("--gpu-lengths", default="1024,2048,4096,8192,16384")
  parser.add_argument("--heads", type=int, default=16)
  parser.add_argument("--kv-heads", type=int, default=4)
  parser.add_argument("--head-dim", type=int, default=128)
  parser.add_argument("--tokens", type=int, default=16384,
                      help="tokens per timed call: batch = max(1, tokens // row length)")
  parser.add_argument("--budget-s", type=float, default=360.0)
  parser.add_argument("--out", default=None, help="also append every line to this file")
  args = parser.parse_args()
  report = Tee(args.out, "")  # a fresh --out file, written as rows come
  lengths = [int(x) for x in args.lengths.split(",")]
  host_tile_table(report, lengths, [int(x) for x in args.tiles.split(",")])
  if not args.kernel:
    return
  import jax
  on_gpu = jax.default_backend() == "gpu"
  kernel_tables(report, lengths)
  worst = error_table(report, args.check_length or (1024 if on_gpu else 48),
                      interpret=not on_gpu)
  if worst > 1e-3:  # a wrong kernel's timings mean nothing
    report(f"\nFAILED: the kernel differs from the reference by {worst:.1e}; no timings")
    sys.exit(1)
  if on_gpu:
    gpu_timings(report, [int(x) for x in args.gpu_lengths.split(",")], args.heads,
                args.kv_heads, args.head_dim, args.tokens, args.budget_s)
  else:
    report("\n(no GPU: kernel timings against cuDNN need jax.default_backend() == 'gpu'; "
           "see benchmarks/attention_gpu.sh)")


if __name__ == "__main__":
  main()
