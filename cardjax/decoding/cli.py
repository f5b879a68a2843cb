"""The decoders' command-line settings, shared by `cardjax generate`, `cardjax eval` and
`cardjax serve`: the flags (add_decoding_arguments) become one `Options` here, and
--block 0 resolves to the checkpoint's own B. Token-level only: loading the checkpoint the
settings apply to is cardjax/restore.py's job."""

from __future__ import annotations

import sys

FALLBACK_BLOCK = 4


def add_decoding_arguments(p) -> None:
  """The decoding flags of `generate` and `eval`, defined once (options_from_args turns
  them into Options)."""
  p.add_argument("--method", default="ar", help="ar | mars | card | dus | eb | cb")
  p.add_argument("--objective", default="",
                 help="the checkpoint's training objective when it has no run config "
                      "(an imported HF model); decides which methods fit")
  p.add_argument("--tau", type=float, default=0.95,
                 help="mars: acceptance threshold (rule entropy_nats: entropy bound in nats); "
                      "card / cb: confidence threshold")
  p.add_argument("--block", type=int, default=0,
                 help="mars: tokens drafted per forward (0: the run's objective.block_size, "
                      "4 without a run config); card / dus / eb / cb: block length (0: 4)")
  p.add_argument("--rule", default="prob",
                 help="mars: prob | entropy | margin | entropy_nats (accept while H <= tau)")
  p.add_argument("--cache-block", type=int, default=0,
                 help="mars: block-level KV cache of this many slots (0: window cache)")
  p.add_argument("--accept-window", default="block", choices=("block", "cache"),
                 help="mars --cache-block: accept up to B tokens per forward (block) or up "
                      "to the cache block's end (cache, as the reference)")
  p.add_argument("--window", default="fit", choices=("fit", "full"),
                 help="mars window cache / --verify: read pending-sized windows (fit) or "
                      "always the widest (full); the same tokens")
  p.add_argument("--verify", action="store_true", help="mars: self-verified, lossless")
  p.add_argument("--order", default="confidence", help="card: confidence | dus")
  p.add_argument("--steps", type=int, default=0,
                 help="card / dus / eb / cb: forward limit per block (0: none)")
  p.add_argument("--gamma", type=float, default=1.0, help="eb: entropy budget")
  p.add_argument("--remask", type=float, default=0.0,
                 help="dus: re-mask new tokens below this probability (0: off)")
  p.add_argument("--spacing", action="store_true", help="eb / cb: dilation spacing filter")
  p.add_argument("--g0", type=int, default=8,
                 help="--spacing: initial gap, max(2, masks left * g0 // block); 8 suits "
                      "blocks of 32, block // 4 keeps that ratio")
  p.add_argument("--base", type=int, default=2, help="dus: dilation base")
  p.add_argument("--max-new-tokens", type=int, default=64)
  p.add_argument("--temperature", type=float, default=0.0,
                 help="ar, mars (not --verify): sampling temperature, 0 = greedy")
  p.add_argument("--top-p", type=float, default=1.0, help="ar, mars: nucleus size")
  p.add_argument("--seed", type=int, default=0, help="ar, mars: sampling seed")


def resolve_block(method: str, block: int, run_config, log=None,
                  command: str = "cardjax generate") -> int:
  """--block, where 0 means the checkpoint's: for MARS the B its run trained with
  (objective.block_size of a mars run config); without one (an HF import) FALLBACK_BLOCK,
  said in one line on `log` (stderr), since decoding with another B than the training one
  is legal but drafts worse. CARD / DUS / EB / CB blocks are a decoding choice (their
  objectives train no block size), so 0 is FALLBACK_BLOCK for them, silently."""
  if block:
    return block
  objective = (run_config or {}).get("objective", {})
  if method != "mars":
    return FALLBACK_BLOCK
  if objective.get("name") == "mars" and objective.get("block_size"):
    return int(objective["block_size"])
  log = log or (lambda line: print(line, file=sys.stderr))
  log(f"{command}: the checkpoint records no MARS block size (no mars run config); "
      f"using --block {FALLBACK_BLOCK}: pass --block B with the B it was trained with")
  return FALLBACK_BLOCK


def options_from_args(args, stop_ids, pad_id: int, block: int, shift: bool = False):
  """The Options of parsed decoding flags (add_decoding_arguments), with the tokenizer's stop
  and pad ids, the resolved block and the checkpoint's shift (MDLM, Dream style)."""
  from cardjax.decoding.methods import Options

  return Options(
      max_new_tokens=args.max_new_tokens, stop_ids=tuple(stop_ids), pad_id=pad_id,
      temperature=args.temperature, top_p=args.top_p, seed=args.seed, tau=args.tau,
      block=block, rule=args.rule, cache_block=args.cache_block, verify=args.verify,
      window=args.window, accept=args.accept_window, order=args.order, steps=args.steps,
      gamma=args.gamma, remask=args.remask, spacing=args.spacing, g0=args.g0, base=args.base,
      shift=shift)
