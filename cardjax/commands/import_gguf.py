"""`cardjax import-gguf FILE CKPT_DIR`: a llama.cpp GGUF file as an orbax checkpoint, its
tokenizer rebuilt from the file's metadata."""

from __future__ import annotations

import time

from cardjax.commands.import_hf import add_written_checkpoint_arguments


def add_arguments(p) -> None:
  p.add_argument("gguf_file", help="a .gguf file, local or gs:// / s3:// (llama, qwen2 or qwen3; "
                                   "F32/F16/BF16/Q8_0/Q4_0/Q4_1/Q5_0/Q5_1/Q4_K/Q6_K tensors)")
  add_written_checkpoint_arguments(p)
  p.add_argument("--mask-token", default="",
                 help="the token MARS/CARD use as [MASK] (default: <|mask|> if present, else "
                      "the last control token the chat template does not use)")


def run(args) -> None:
  import tempfile

  from cardjax import checkpoint
  from cardjax.hf import gguf
  from cardjax.model import param_count
  from cardjax.parallel.mesh import local_mesh
  from cardjax.storage import check
  from cardjax.storage.transfer import cached_copy

  check(args.checkpoint_dir)  # an unusable output bucket fails before the download
  args.gguf_file = str(cached_copy(args.gguf_file))  # a bucket object: read a local copy
  start = time.time()
  # Everything is read and checked before the checkpoint folder is touched.
  f = gguf.GGUFFile(args.gguf_file)
  gguf.check_file(f)
  with tempfile.TemporaryDirectory() as assets:
    gguf.write_tokenizer(f, assets, mask=args.mask_token or None)
    mask_id = gguf.mask_token(f, args.mask_token or None)[1]
    extra = {"scan_layers": args.scan_layers, "mask_token_id": mask_id}
    if args.param_dtype:
      extra["param_dtype"] = args.param_dtype
    model = gguf.from_gguf(f, mesh=local_mesh(), **extra)
    path = checkpoint.save_model(args.checkpoint_dir, model, step=args.step,
                                 assets_from=assets)
  print(f"imported {param_count(model):,} parameters ({f.architecture}, [MASK] id {mask_id}) "
        f"from {f.path} -> {path} (step {args.step}, {time.time() - start:.1f}s)")
