"""`cardjax export-hf CKPT_DIR HF_DIR`: an orbax checkpoint as a Hugging Face folder, with
the tokenizer files the checkpoint keeps in hf_assets/. A LoRA run's checkpoint is written
merged (base + adapters): a plain model that transformers loads without peft; with
`--lora peft` it is written as a PEFT adapter folder instead (cardjax/peft_export.py)."""

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
  p.add_argument("--lora", choices=("merged", "peft"), default="merged",
                 help="a LoRA run as one merged model (default), or as a PEFT adapter folder "
                      "(adapter_config.json, adapter_model.safetensors) over its base")
  p.add_argument("--base-out", default=None,
                 help="with --lora peft: also write the base model as a HF folder here "
                      "(default: only when the base is a cardjax checkpoint, to HF_DIR/base)")


def run(args) -> None:
  from cardjax import checkpoint, hf
  from cardjax.parallel.mesh import local_mesh
  from cardjax.storage import checked_path, check, resolve

  args.checkpoint_dir, args.hf_dir = resolve(args.checkpoint_dir), resolve(args.hf_dir)
  check(args.hf_dir)  # an unusable output bucket fails before the weights are read
  if args.lora == "peft":
    return _run_peft(args)
  if args.base_out is not None:
    from cardjax.errors import CardjaxError
    raise CardjaxError("--base-out writes the base of a PEFT adapter: add --lora peft")
  model, step = checkpoint.restore_model(args.checkpoint_dir, step=args.step,
                                         mesh=local_mesh(), lora_base=args.lora_base)
  assets = f"{args.checkpoint_dir}/{checkpoint.ASSETS}"
  out = hf.save_pretrained(model, args.hf_dir, dtype=args.dtype,
                           assets_from=assets if checked_path(assets).is_dir() else None,
                           max_shard_bytes=int(args.max_shard_gb * 2**30))
  print(f"exported step {step} of {args.checkpoint_dir} -> {out}")


def _run_peft(args) -> None:
  from cardjax.peft_export import export_run
  from cardjax.parallel.mesh import local_mesh

  out, base, wrote = export_run(args.checkpoint_dir, args.hf_dir, step=args.step,
                                lora_base=args.lora_base, base_out=args.base_out,
                                dtype=args.dtype, mesh=local_mesh(),
                                max_shard_bytes=int(args.max_shard_gb * 2**30))
  print(f"exported the LoRA adapter of {args.checkpoint_dir} -> {out} (PEFT); base model "
        f"{'written to ' if wrote else ''}{base}")
