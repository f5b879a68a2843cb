"""The decoders' command-line settings, shared by `cardjax generate`, `cardjax eval` and
`cardjax serve`: the flags (cardjax/cli.py: decoding_args) become one `Options` here, and
--block 0 resolves to the checkpoint's own B. Token-level only: loading the checkpoint the
settings apply to is cardjax/restore.py's job."""

from __future__ import annotations

import sys

FALLBACK_BLOCK = 4


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
  """The Options of parsed decoding flags (decoding_args), with the tokenizer's stop and pad
  ids, the resolved block and the checkpoint's shift (MDLM, Dream style)."""
  from cardjax.decoding.methods import Options

  return Options(
      max_new_tokens=args.max_new_tokens, stop_ids=tuple(stop_ids), pad_id=pad_id,
      temperature=args.temperature, top_p=args.top_p, seed=args.seed, tau=args.tau,
      block=block, rule=args.rule, cache_block=args.cache_block, verify=args.verify,
      window=args.window, accept=args.accept_window, order=args.order, steps=args.steps,
      gamma=args.gamma, remask=args.remask, spacing=args.spacing, base=args.base, shift=shift)
