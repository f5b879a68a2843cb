"""`cardjax generate`: decode prompts from a checkpoint and print text and speed metrics."""

from __future__ import annotations

import time
from pathlib import Path

from cardjax.errors import CardjaxError

METHODS = ("ar", "mars")


def _tokenizer(checkpoint_dir: Path, explicit: str, model_cfg):
  from cardjax import checkpoint
  from cardjax.data.tokenizer import load_tokenizer

  if explicit:
    return load_tokenizer(explicit, mask_token_id=model_cfg.mask_token_id)
  if (checkpoint_dir / checkpoint.ASSETS / "tokenizer.json").is_file():
    return load_tokenizer(checkpoint_dir / checkpoint.ASSETS,
                          mask_token_id=model_cfg.mask_token_id)
  config = checkpoint.read_run_config(checkpoint_dir)
  if config is None:
    raise CardjaxError(f"{checkpoint_dir} names no tokenizer; pass --tokenizer HF_FOLDER")
  from cardjax.config import merge_into_base
  from cardjax.data.prepare import load_data_tokenizer
  return load_data_tokenizer(merge_into_base(config))


def run_generate(args) -> None:
  from cardjax import checkpoint
  from cardjax.decoding import ar, mars

  root = Path(args.checkpoint)
  root = root / "checkpoints" if (root / "checkpoints").is_dir() else root
  if args.method not in METHODS:
    raise CardjaxError(f"--method {args.method} is not built yet; available: {METHODS}")
  model, step = checkpoint.restore_model(root)
  tokenizer = _tokenizer(root, args.tokenizer, model.cfg)
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
  stop = tokenizer.stop_ids
  start = time.perf_counter()
  rows, forwards, tokens = [], 0, 0
  for i in range(0, len(prompts), args.batch):
    chunk = prompts[i:i + args.batch]
    if args.method == "ar":
      out = ar.generate(model, chunk, args.max_new_tokens, stop_ids=stop,
                        pad_id=tokenizer.pad_id, temperature=args.temperature,
                        top_p=args.top_p, seed=args.seed)
    else:
      if model.cfg.mask_token_id < 0:
        raise CardjaxError(f"{root} has no [MASK] id (model.mask_token_id); it cannot "
                           "serve --method mars")
      out = mars.generate(model, chunk, args.max_new_tokens, block=args.block, tau=args.tau,
                          mask_id=model.cfg.mask_token_id, stop_ids=stop,
                          pad_id=tokenizer.pad_id)
    rows += out.rows()
    forwards += out.forwards
    tokens += int(out.lengths.sum())
  seconds = time.perf_counter() - start
  for text, row in zip(texts, rows):
    print(f"--- {text!r}\n{tokenizer.decode(row, skip_special=True)}")
  print(f"method {args.method} (step {step}): {tokens} tokens, {forwards} forwards, "
        f"{tokens / max(forwards, 1) / max(1, min(args.batch, len(prompts))):.2f} tokens per "
        f"forward per row, {tokens / seconds:.1f} tokens/s, {seconds:.2f}s "
        "(compile included)")
