"""`cardjax export-hf CKPT_DIR HF_DIR`: an orbax checkpoint as a Hugging Face folder, with
the tokenizer files the checkpoint keeps in hf_assets/. A LoRA run's checkpoint is written
merged (base + adapters): a plain model that transformers loads without peft."""

from __future__ import annotations


def add_arguments(p) -> None:
  p.add_argument("checkpoint_dir", help="orbax checkpoint folder (cardjax init/train/import-hf); "
                                         "local, gs:// or s3://")
  p.add_argument("hf_dir", help="HF folder to write (local, gs:// or s3://)")
  p.add_argument("--step", type=int, default=None, help="step to export (default latest)")
  p.add_argument("--dtype", choices=("float32", "bfloat16", "float16"), default=None,
                 help="tensor dtype on disk (default: the parameters' dtype)")
  p.add_argument("--max-shard-gb", type=float, default=5.0, help="largest safetensors shard")
  p.add_argument("--lora-base", default=None,
                 help="a LoRA run's base model, when it is no longer where the run read it")


def run(args) -> None:
  from cardjax import checkpoint, hf
  from cardjax.parallel.mesh import local_mesh
  from cardjax.storage import checked_path, check, resolve

  args.checkpoint_dir, args.hf_dir = resolve(args.checkpoint_dir), resolve(args.hf_dir)
  check(args.hf_dir)  # an unusable output bucket fails before the weights are read
  model, step = checkpoint.restore_model(args.checkpoint_dir, step=args.step,
                                         mesh=local_mesh(), lora_base=args.lora_base)
  assets = f"{args.checkpoint_dir}/{checkpoint.ASSETS}"
  out = hf.save_pretrained(model, args.hf_dir, dtype=args.dtype,
                           assets_from=assets if checked_path(assets).is_dir() else None,
                           max_shard_bytes=int(args.max_shard_gb * 2**30))
  print(f"exported step {step} of {args.checkpoint_dir} -> {out}")
