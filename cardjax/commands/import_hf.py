"""`cardjax import-hf HF_DIR CKPT_DIR`: a Hugging Face folder as an orbax checkpoint."""

from __future__ import annotations

import time


def add_written_checkpoint_arguments(p) -> None:
  """The flags of the checkpoint an import writes (import-hf and import-gguf)."""
  p.add_argument("checkpoint_dir", help="orbax checkpoint folder to write (local, gs:// or "
                                         "s3://)")
  p.add_argument("--step", type=int, default=0, help="step number to save as (default 0)")
  p.add_argument("--param-dtype", choices=("float32", "bfloat16"), default=None,
                 help="storage dtype of the parameters (default float32)")
  p.add_argument("--scan-layers", action="store_true", help="store layers stacked for scan")


def add_arguments(p) -> None:
  p.add_argument("hf_dir", help="HF model folder (config.json + safetensors); local, or "
                                 "gs:// / s3:// (downloaded first)")
  add_written_checkpoint_arguments(p)
  p.add_argument("--mask-token-id", type=int, default=None,
                 help="[MASK] id to record (default: config.json's mask_token_id, else the "
                      "tokenizer's mask_token or <|mask|>, else none)")


def run(args) -> None:
  from cardjax import checkpoint, hf
  from cardjax.hf.config import read_config_json
  from cardjax.hf.mask import import_mask_id
  from cardjax.model import param_count
  from cardjax.parallel.mesh import local_mesh
  from cardjax.storage import check
  from cardjax.storage.transfer import cached_copy

  check(args.checkpoint_dir)  # an unusable output bucket fails before the download
  args.hf_dir = str(cached_copy(args.hf_dir))  # a bucket folder: read from a local copy
  extra = {"scan_layers": args.scan_layers}
  if args.param_dtype:
    extra["param_dtype"] = args.param_dtype
  if args.mask_token_id is not None:
    extra["mask_token_id"] = args.mask_token_id
  else:  # config.json's mask_token_id, else the tokenizer's (a MARS release has only that)
    mask_id = import_mask_id(args.hf_dir, read_config_json(args.hf_dir))
    if mask_id is not None:
      extra["mask_token_id"] = mask_id
  start = time.time()
  model = hf.from_pretrained(args.hf_dir, mesh=local_mesh(), **extra)
  path = checkpoint.save_model(args.checkpoint_dir, model, step=args.step,
                               assets_from=args.hf_dir)
  print(f"imported {param_count(model):,} parameters from {args.hf_dir} -> {path} "
        f"(step {args.step}, {time.time() - start:.1f}s)")
