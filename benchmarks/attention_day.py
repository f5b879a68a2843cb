"""The attention section of the prepared GPU call: the block-sparse Pallas GPU kernel against
cuDNN, forward and forward+backward, as JSON (benchmarks/attention.py's timing table).

  python -m benchmarks.attention_day [--lengths 4096,16384] [--json OUT.json] [--md OUT.md]

First the compiled kernel against the dense reference (output and gradients, L = 1024, the
timed patterns); a kernel off by more than 1e-3 gets no timings. On an sm_90 GPU the Hopper
kernels (attention_impl=pallas_mgpu: forward and backward) are checked the same way in bf16
on every mask kind (within 3e-2 of the largest entry) and, if they pass, timed in their
own column beside the others; if their backward fails, the Hopper forward with the Triton
backward is tried (summary "hopper_backward" says which was timed). Then, per
pattern (MARS dual stream, 4 packed documents, causal) and row length: ms of the kernel, of
cuDNN with the dense mask and of cuDNN causal over the same row, bf16, 16 heads / 4 kv
heads, d = 128, 16384 tokens a call; TFLOP/s count the pattern's visible (query, key) pairs
only (4 d flops a pair forward, 14 d forward+backward, per head), so `share_of_causal` is
the kernel's useful TFLOP/s as a share of cuDNN causal's. --smoke runs the same code on a
CPU (interpret mode, XLA in place of cuDNN, toy sizes).
"""

from __future__ import annotations

from benchmarks.common import arg_parser

COLUMNS = [("pattern", "pattern", ""), ("length", "L", "d"), ("pass", "pass", ""),
           ("kernel_ms", "kernel ms", ".2f"), ("cudnn_masked_ms", "cuDNN + mask ms", ".2f"),
           ("cudnn_causal_ms", "cuDNN causal ms", ".2f"),
           ("kernel_tflops", "kernel useful TFLOP/s", ".0f"),
           ("speedup_vs_masked", "vs cuDNN + mask", ".2f"),
           ("share_of_causal", "share of cuDNN causal", ".0%")]


HOPPER_COLUMNS = [("hopper_ms", "Hopper kernel ms", ".2f"),
                  ("hopper_share_of_causal", "Hopper share of cuDNN causal", ".0%")]
HOPPER_TOLERANCE = 3e-2  # bf16 inputs and probabilities, relative to the largest entry


def _hopper_checked(section, args, on_gpu: bool, patterns) -> str | None:
  """Which backward the Hopper column runs: "mosaic" (attention_impl=pallas_mgpu) when its
  forward and gradients are within HOPPER_TOLERANCE of the reference on every pattern, else
  "triton" (the Hopper forward with pallas_gpu's backward) when that passes, else None (no
  column). Needs an sm_90 GPU and a head dim the kernels serve; noted either way."""
  import jax

  from benchmarks.attention import hopper_errors

  capability = getattr(jax.devices()[0], "compute_capability", "") if on_gpu else ""
  if not str(capability).startswith("9") or args.head_dim not in (64, 128):
    section.note(f"no Hopper kernel column: needs an sm_90 GPU and head_dim 64 or 128 "
                 f"(compute capability {capability or 'none'}, head_dim {args.head_dim})")
    return None
  for backward in ("mosaic", "triton"):
    try:
      worst = hopper_errors(print, args.check_length, interpret=False, patterns=patterns,
                            backward=backward)
    except Exception as e:  # noqa: BLE001  the Triton and cuDNN rows still run
      section.note(f"Hopper kernels ({backward} backward) failed their check: "
                   f"{type(e).__name__}: {str(e)[:300]}")
      continue
    section.data["summary"][f"hopper_{backward}_max_relative_error"] = worst
    if worst <= HOPPER_TOLERANCE:
      section.data["summary"]["hopper_backward"] = backward
      return backward
    section.note(f"Hopper kernels ({backward} backward) off the reference by {worst:.1e} "
                 f"(> {HOPPER_TOLERANCE}): not timed")
  return None


def main() -> None:
  parser = arg_parser(__spec__, __doc__)
  parser.add_argument("--lengths", default="4096,16384")
  parser.add_argument("--tokens", type=int, default=16384)
  parser.add_argument("--heads", type=int, default=16)
  parser.add_argument("--kv-heads", type=int, default=4)
  parser.add_argument("--head-dim", type=int, default=128)
  parser.add_argument("--check-length", type=int, default=1024)
  parser.add_argument("--budget-s", type=float, default=60.0,
                      help="start no new timing row after this many seconds")
  parser.add_argument("--smoke", action="store_true", help="toy sizes on a CPU")
  parser.add_argument("--json", default="attention.json")
  parser.add_argument("--md", default=None)
  args = parser.parse_args()
  if args.smoke:
    args.lengths, args.tokens, args.heads, args.kv_heads = "32", 64, 2, 1
    args.head_dim, args.check_length = 16, 32

  import jax

  from benchmarks.attention import GPU_PATTERNS, PATTERNS, error_table, gpu_timings
  from benchmarks.sections import Section

  lengths = [int(x) for x in args.lengths.split(",")]
  on_gpu = jax.default_backend() == "gpu"
  patterns = GPU_PATTERNS[-1:] if args.smoke else GPU_PATTERNS
  sizes = {"lengths": lengths, "tokens_per_call": args.tokens, "heads": args.heads,
           "kv_heads": args.kv_heads, "head_dim": args.head_dim, "dtype": "bfloat16",
           "patterns": [p[0] for p in patterns], "check_length": args.check_length,
           "timing": "median of 5 calls after a compile-and-warm call",
           "baseline": "cudnn" if not args.smoke else "xla (smoke)"}
  section = Section(args.json, args.md, "attention",
                    "Attention kernels: the Pallas GPU kernel against cuDNN", sizes,
                    smoke=args.smoke)
  if not on_gpu and not args.smoke:
    section.note("no GPU here (jax.default_backend() != 'gpu'): nothing timed; --smoke "
                 "runs the table's code on a CPU")
    section.data["status"] = "skipped"
    section.finish()
    return
  try:
    worst = error_table(print, args.check_length, interpret=not on_gpu, patterns=patterns)
    section.data["summary"]["max_error"] = worst
    if worst > 1e-3:
      raise RuntimeError(f"the kernel differs from the reference by {worst:.1e}: no timings")
    # The Hopper kernels have not yet run on a GPU: every mask kind is checked, not only
    # the timed ones.
    hopper = _hopper_checked(section, args, on_gpu, patterns if args.smoke else PATTERNS)
    columns = COLUMNS + (HOPPER_COLUMNS if hopper else [])
    section.table(columns, f"max |kernel - reference| over output and gradients: {worst:.1e}")
    gpu_timings(print, lengths, args.heads, args.kv_heads, args.head_dim, args.tokens,
                args.budget_s, patterns=patterns, on_row=section.row, smoke=args.smoke,
                hopper=hopper)
  except Exception as e:
    section.fail(e)
    raise
  rows = [r for r in section.data["rows"] if r["pass"] == "fwd+bwd"]
  summary = {}
  if rows:
    best = max(rows, key=lambda r: r["length"])
    summary[f"{best['pattern']} L={best['length']} fwd+bwd share of cuDNN causal"] = (
        f"{best['share_of_causal']:.0%}")
  section.finish(**summary)


if __name__ == "__main__":
  main()
