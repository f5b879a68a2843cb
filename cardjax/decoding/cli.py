"""`cardjax generate`: decode prompts from a checkpoint and print text and speed metrics."""

from __future__ import annotations

import sys
import time
from pathlib import Path

from cardjax.errors import CardjaxError

FALLBACK_BLOCK = 4


def resolve_block(method: str, block: int, run_config, log=None) -> int:
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
  log(f"cardjax generate: the checkpoint records no MARS block size (no mars run config); "
      f"using --block {FALLBACK_BLOCK}: pass --block B with the B it was trained with")
  return FALLBACK_BLOCK


def run_generate(args) -> None:
  """Restore on a mesh of all local devices (fsdp: parameters and batch rows sharded, the
  KV cache with them) and decode under it; on one device the mesh is trivial."""
  import contextlib

  import jax

  from cardjax.parallel import make_mesh

  mesh = make_mesh(1, -1, 1) if jax.device_count() > 1 else None
  with jax.set_mesh(mesh) if mesh is not None else contextlib.nullcontext():
    _generate(args, mesh)


def _generate(args, mesh) -> None:
  from cardjax import checkpoint
  from cardjax.decoding.methods import Options, check_method, make_decoder

  root = Path(args.checkpoint)
  root = root / "checkpoints" if (root / "checkpoints").is_dir() else root
  run_config = checkpoint.read_run_config(root) if root.is_dir() else None
  objective = args.objective or (run_config or {}).get("objective", {}).get("name")
  check_method(args.method, objective, where=str(root))
  model, step = checkpoint.restore_model(root, mesh=mesh)
  tokenizer = checkpoint.load_tokenizer(root, model.cfg, args.tokenizer)
  if args.prompt is not None:
    texts = [args.prompt]
  else:
    texts = [line.rstrip("\n") for line in open(args.prompts) if line.strip()]
  if not texts or not all(texts):
    raise CardjaxError("give a non-empty --prompt or a --prompts file with one prompt a line")
  if args.chat:
    texts = [tokenizer.render_chat([{"role": "user", "content": t}], add_generation_prompt=True)
             for t in texts]
  prompts = [tokenizer.encode(t) for t in texts]
  shift = bool((run_config or {}).get("objective", {}).get("shift", False))
  block = resolve_block(args.method, args.block, run_config)
  options = Options(
      max_new_tokens=args.max_new_tokens, stop_ids=tokenizer.stop_ids, pad_id=tokenizer.pad_id,
      temperature=args.temperature, top_p=args.top_p, seed=args.seed, tau=args.tau,
      block=block, rule=args.rule, cache_block=args.cache_block, verify=args.verify,
      window=args.window, accept=args.accept_window, order=args.order, steps=args.steps,
      gamma=args.gamma, remask=args.remask, spacing=args.spacing, base=args.base, shift=shift)
  decode = make_decoder(args.method, model, objective, options)
  start = time.perf_counter()
  rows, row_forwards, tokens = [], 0, 0
  for i in range(0, len(prompts), args.batch):
    chunk = prompts[i:i + args.batch]
    out = decode(chunk)
    rows += out.rows()
    row_forwards += out.forwards * len(chunk)
    tokens += int(out.lengths.sum())
  seconds = time.perf_counter() - start
  for text, row in zip(texts, rows):
    print(f"--- {text!r}\n{tokenizer.decode(row, skip_special=True)}")
  setting = "" if args.method == "ar" else f" B={block}"
  print(f"method {args.method}{setting} (step {step}, objective {objective or 'unknown'}): "
        f"{tokens} tokens, {row_forwards} row-forwards, {tokens / max(row_forwards, 1):.2f} "
        f"tokens per forward, {tokens / seconds:.1f} tokens/s, {seconds:.2f}s latency "
        "(compile included)")
