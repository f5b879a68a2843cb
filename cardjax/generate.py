"""`cardjax generate`: decode prompts from a checkpoint and print text and speed metrics.

Text in, text out: it reads the checkpoint and its tokenizer (cardjax/restore.py), so it
sits above cardjax/decoding/, whose samplers take token arrays only."""

from __future__ import annotations

import time

from cardjax.errors import CardjaxError
from cardjax.storage import checked_path


def add_arguments(p) -> None:
  from cardjax.decoding.cli import add_decoding_arguments

  p.add_argument("--checkpoint", required=True,
                 help="a run folder or its checkpoints/ (local, gs:// or s3://)")
  group = p.add_mutually_exclusive_group(required=True)
  group.add_argument("--prompt", help="one prompt")
  group.add_argument("--prompts", help="a file with one prompt per line")
  add_decoding_arguments(p)
  p.add_argument("--batch", type=int, default=1, help="prompts decoded together")
  p.add_argument("--chat", action="store_true", help="wrap prompts in the chat template")
  p.add_argument("--tokenizer", default="", help="HF tokenizer folder (default: the run's)")


def run(args) -> None:
  """Restore on a mesh of all local devices (fsdp: parameters and batch rows sharded, the
  KV cache with them) and decode under it; on one device the mesh is trivial."""
  import contextlib

  import jax

  from cardjax.parallel import make_mesh

  mesh = make_mesh(1, -1, 1) if jax.device_count() > 1 else None
  with jax.set_mesh(mesh) if mesh is not None else contextlib.nullcontext():
    _generate(args, mesh)


def _read_prompts(args) -> list[str]:
  """--prompt, or the non-blank lines of the --prompts file (local, gs:// or s3://)."""
  if args.prompt is not None:
    texts = [args.prompt]
  else:
    path = checked_path(args.prompts)
    if not path.is_file():
      raise CardjaxError(f"--prompts {args.prompts} does not exist; give a file with one "
                         "prompt a line")
    texts = [line for line in path.read_text().splitlines() if line.strip()]
  if not texts or not all(texts):
    raise CardjaxError("give a non-empty --prompt or a --prompts file with one prompt a line")
  return texts


def _generate(args, mesh) -> None:
  from cardjax.decoding.cli import options_from_args, resolve_block
  from cardjax.decoding.methods import make_decoder
  from cardjax.restore import load_run

  texts = _read_prompts(args)  # a bad prompts file fails before minutes of restoring
  run = load_run(args.checkpoint, mesh=mesh, tokenizer=args.tokenizer,
                 objective=args.objective, method=args.method)
  tokenizer = run.tokenizer
  if args.chat:
    texts = [tokenizer.render_chat([{"role": "user", "content": t}], add_generation_prompt=True)
             for t in texts]
  prompts = [tokenizer.encode(t) for t in texts]
  run_config = run.run_config
  block = resolve_block(args.method, args.block, run_config)
  options = options_from_args(args, tokenizer.stop_ids, tokenizer.pad_id, block, run.shift)
  decode = make_decoder(args.method, run.model, run.objective, options)
  start = time.perf_counter()
  rows, row_forwards, tokens = [], 0, 0
  for i in range(0, len(prompts), args.batch):
    chunk = prompts[i:i + args.batch]
    out = decode(chunk)
    rows += out.rows()
    row_forwards += int(out.row_forwards.sum())  # while each row generates
    tokens += int(out.lengths.sum())
  seconds = time.perf_counter() - start
  for text, row in zip(texts, rows):
    print(f"--- {text!r}\n{tokenizer.decode(row, skip_special=True)}")
  setting = "" if args.method == "ar" else f" B={block}"
  print(f"method {args.method}{setting} (step {run.step}, objective "
        f"{run.objective or 'unknown'}): {tokens} tokens, {row_forwards} row-forwards, "
        f"{tokens / max(row_forwards, 1):.2f} tokens per forward, {tokens / seconds:.1f} "
        f"tokens/s, {seconds:.2f}s latency (compile included)")
