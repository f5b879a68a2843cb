"""The `cardjax` command.

  cardjax config     --config configs/tiny.py [--config.k=v ...]   print the resolved config
  cardjax init       --config configs/tiny.py --workdir DIR          random-init checkpoint
  cardjax train      --config configs/tiny_ar.py --workdir DIR       train or resume
  cardjax generate   --checkpoint RUN --prompt TEXT [--method mars --tau 0.9]
  cardjax eval       --checkpoint RUN --task nll|arith|jsonl [--compare RUN2] [--out R.json]
  cardjax import-hf  HF_DIR CKPT_DIR [--dtype D] [--scan-layers]     HF folder -> orbax
  cardjax export-hf  CKPT_DIR HF_DIR [--step N] [--dtype D]          orbax -> HF folder
  cardjax import-gguf FILE CKPT_DIR [--mask-token T]                 llama.cpp GGUF -> orbax
  cardjax data build NAME [--data_dir D] [--OPTION VALUE ...]       dataset + tokenizer
  cardjax data show  NAME [--data_dir D] [--n 3] [--split S]         decoded rows
  cardjax demo       [--workdir runs/demo]                           the end-to-end demo
  cardjax serve      --checkpoint RUN [--method mars] [--port 8000]   OpenAI-compatible server

Errors the user can fix print one line (`cardjax: error: ...`) and exit with status 2.
"""

from __future__ import annotations

import argparse
import logging
import sys
import time
from pathlib import Path

from cardjax.errors import CardjaxError

log = logging.getLogger("cardjax")


def _config_arg(parser: argparse.ArgumentParser, required: bool = True) -> None:
  parser.add_argument("--config", required=required,
                      help="config file (path.py or path.py:arg); override fields with "
                           "--config.section.key=value")


def _mesh():
  """All local devices on the fsdp axis: large models load sharded, small ones replicate."""
  import jax

  from cardjax.parallel import make_mesh
  return make_mesh(1, -1, 1) if jax.device_count() > 1 else None


def cmd_config(args, overrides) -> None:
  from cardjax.config import load_config
  print(load_config(args.config, overrides))


def cmd_init(args, overrides) -> None:
  from cardjax import checkpoint
  from cardjax.config import load_config, model_config
  from cardjax.model import create_model, param_count

  config = load_config(args.config, overrides)
  model = create_model(model_config(config), seed=config.seed, mesh=_mesh())
  # The run config goes with it, as a training run's does: serve, generate and eval find
  # the config's tokenizer there.
  path = checkpoint.save_model(Path(args.workdir) / "checkpoints", model, step=0,
                               run_config=config)
  print(f"initialised {param_count(model):,} parameters -> {path}")


def cmd_import_hf(args, overrides) -> None:
  from cardjax import checkpoint, hf
  from cardjax.hf.config import read_config_json
  from cardjax.hf.mask import import_mask_id
  from cardjax.model import param_count

  if overrides:
    raise CardjaxError(f"import-hf takes no --config overrides, got {overrides}")
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
  model = hf.from_pretrained(args.hf_dir, mesh=_mesh(), **extra)
  path = checkpoint.save_model(args.checkpoint_dir, model, step=args.step,
                               assets_from=args.hf_dir)
  print(f"imported {param_count(model):,} parameters from {args.hf_dir} -> {path} "
        f"(step {args.step}, {time.time() - start:.1f}s)")


def cmd_import_gguf(args, overrides) -> None:
  import tempfile

  from cardjax import checkpoint
  from cardjax.hf import gguf
  from cardjax.model import param_count

  if overrides:
    raise CardjaxError(f"import-gguf takes no --config overrides, got {overrides}")
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
    model = gguf.from_gguf(f, mesh=_mesh(), **extra)
    path = checkpoint.save_model(args.checkpoint_dir, model, step=args.step,
                                 assets_from=assets)
  print(f"imported {param_count(model):,} parameters ({f.architecture}, [MASK] id {mask_id}) "
        f"from {f.path} -> {path} (step {args.step}, {time.time() - start:.1f}s)")


def cmd_export_hf(args, overrides) -> None:
  from cardjax import checkpoint, hf

  if overrides:
    raise CardjaxError(f"export-hf takes no --config overrides, got {overrides}")
  model, step = checkpoint.restore_model(args.checkpoint_dir, step=args.step, mesh=_mesh())
  assets = Path(args.checkpoint_dir) / checkpoint.ASSETS
  out = hf.save_pretrained(model, args.hf_dir, dtype=args.dtype,
                           assets_from=assets if assets.is_dir() else None,
                           max_shard_bytes=int(args.max_shard_gb * 2**30))
  print(f"exported step {step} of {args.checkpoint_dir} -> {out}")


def _data_config(args, overrides, options: dict):
  from cardjax.config import base_config, load_config

  config = load_config(args.config, overrides) if args.config else base_config()
  config.data.dataset = args.name
  if options:
    config.data.options = {**config.data.options.to_dict(), **options}
  if args.data_dir:
    config.data.data_dir = args.data_dir
  if args.tokenizer_vocab:
    config.data.tokenizer_vocab = args.tokenizer_vocab
  return config


def cmd_data_build(args, overrides, options) -> None:
  from cardjax.data.prepare import data_dir, prepare

  config = _data_config(args, overrides, options)
  builder, tokenizer = prepare(config)
  splits = {k: v.num_examples for k, v in builder.info.splits.items()}
  print(f"{args.name}: {splits} in {builder.data_dir}")
  print(f"tokenizer: {tokenizer.vocab_size} ids, [MASK]={tokenizer.mask_id}, "
        f"EOS={tokenizer.eos_id} ({tokenizer.source or data_dir(config)})")


def cmd_data_show(args, overrides, options) -> None:
  from cardjax.data import builders
  from cardjax.data.prepare import data_dir, load_data_tokenizer, pipeline_spec
  from cardjax.data.show import show_rows

  config = _data_config(args, overrides, options)
  if args.name in ("sft_jsonl", "arith_sft"):
    config.data.mode = "sft"
    config.data.packing = False
  split = args.split or config.data.split
  source = builders.load_source(args.name, split, data_dir(config),
                                **config.data.options.to_dict())
  tokenizer = load_data_tokenizer(config)
  print(f"{args.name}/{split}: {len(source)} examples; loss-carrying tokens are shown "
        "\u27e6like this\u27e7")
  for row in show_rows(source, tokenizer, pipeline_spec(config), args.n):
    print(row)


def cmd_train(args, overrides) -> int:
  import jax

  from cardjax.config import load_config
  from cardjax.train import Preempted, train

  config = load_config(args.config, overrides)
  if jax.process_count() == 1:  # one process: build a missing dataset, as tfds.load does
    from cardjax.data.prepare import prepare
    prepare(config)  # (hosts of a pod job would race on a shared data_dir: they build first)
  try:
    result = train(config, args.workdir)
  except Preempted as e:
    print(f"cardjax: {e}", file=sys.stderr)
    return 143
  train_m, eval_m = result["train"], result["eval"]
  print(f"trained {result['step']} steps: loss {train_m.get('loss', float('nan')):.4f}; "
        f"validation loss {eval_m.get('loss', float('nan')):.4f}, "
        f"AR NLL {eval_m.get('ar_nll', float('nan')):.4f}; {args.workdir}")
  return 0


def cmd_plan(args, overrides) -> int:
  import json

  from cardjax.config import load_config
  from cardjax.plan import report, run_plan

  config = load_config(args.config, overrides)
  if not 0 < args.mfu <= 1:
    raise CardjaxError(f"--mfu={args.mfu} must lie in (0, 1] (e.g. 0.4 for 40%)")
  plans = run_plan(config, args.topology, search=not args.no_search)
  print(report(config, plans, args.mfu))
  if args.json:
    Path(args.json).write_text(json.dumps(
        {"config": args.config, "overrides": overrides, "topology": args.topology,
         "mfu": args.mfu, "plans": [dict(vars(p), target=vars(p.target)) for p in plans]},
        indent=1))
  return 0 if plans[-1].fits and plans[-1] is plans[0] else (3 if plans[-1].fits else 1)


def cmd_generate(args, overrides) -> None:
  from cardjax.generate import run_generate

  if overrides:
    raise CardjaxError(f"generate takes no --config overrides, got {overrides}")
  run_generate(args)


def cmd_eval(args, overrides) -> int:
  from cardjax.eval.cli import run_eval

  if overrides:
    raise CardjaxError(f"eval takes no --config overrides, got {overrides}")
  return run_eval(args)


def cmd_serve(args, overrides) -> None:
  from cardjax.serve.cli import run_serve

  if overrides:
    raise CardjaxError(f"serve takes no --config overrides, got {overrides}")
  run_serve(args)


def cmd_demo(args, overrides) -> None:
  from cardjax.demo import run_demo
  run_demo(args.workdir, overrides)


def _options(rest: list[str]) -> tuple[dict, list[str]]:
  """Dataset builder options written --key value or --key=value (the builder checks them)."""
  options, unknown, i = {}, [], 0
  while i < len(rest):
    arg = rest[i]
    if arg.startswith("--") and "=" in arg:
      key, value = arg[2:].split("=", 1)
      options[key] = value
    elif arg.startswith("--") and i + 1 < len(rest) and not rest[i + 1].startswith("--"):
      options[arg[2:]] = rest[i + 1]
      i += 1
    else:
      unknown.append(arg)
    i += 1
  return options, unknown


def decoding_args(p: argparse.ArgumentParser) -> None:
  """The decoding flags of `generate` and `eval` (one spelling; decoding/cli.py:
  options_from_args turns them into Options)."""
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
  p.add_argument("--base", type=int, default=2, help="dus: dilation base")
  p.add_argument("--max-new-tokens", type=int, default=64)
  p.add_argument("--temperature", type=float, default=0.0,
                 help="ar, mars (not --verify): sampling temperature, 0 = greedy")
  p.add_argument("--top-p", type=float, default=1.0, help="ar, mars: nucleus size")
  p.add_argument("--seed", type=int, default=0, help="ar, mars: sampling seed")


def build_parser() -> argparse.ArgumentParser:
  parser = argparse.ArgumentParser(prog="cardjax", description=__doc__, allow_abbrev=False,
                                   formatter_class=argparse.RawDescriptionHelpFormatter)
  parser.add_argument("-v", "--verbose", action="store_true", help="debug logging")
  sub = parser.add_subparsers(dest="command", required=True)

  p = sub.add_parser("config", help="print the resolved, validated config")
  _config_arg(p)
  p.set_defaults(fn=cmd_config)

  p = sub.add_parser("init", help="write a random-init orbax checkpoint for a config")
  _config_arg(p)
  p.add_argument("--workdir", required=True, help="run folder; checkpoints go to WORKDIR/checkpoints")
  p.set_defaults(fn=cmd_init)

  p = sub.add_parser("train", help="train (or resume) a model with a config")
  _config_arg(p)
  p.add_argument("--workdir", required=True, help="run folder: checkpoints, metrics.jsonl, "
                                                  "tensorboard/; an existing run resumes")
  p.set_defaults(fn=cmd_train)

  p = sub.add_parser("generate", help="decode prompts from a checkpoint")
  p.add_argument("--checkpoint", required=True, help="a run folder or its checkpoints/")
  group = p.add_mutually_exclusive_group(required=True)
  group.add_argument("--prompt", help="one prompt")
  group.add_argument("--prompts", help="a file with one prompt per line")
  decoding_args(p)
  p.add_argument("--batch", type=int, default=1, help="prompts decoded together")
  p.add_argument("--chat", action="store_true", help="wrap prompts in the chat template")
  p.add_argument("--tokenizer", default="", help="HF tokenizer folder (default: the run's)")
  p.set_defaults(fn=cmd_generate)

  p = sub.add_parser("eval", help="score checkpoints: nll | arith | jsonl (docs/evaluation.md)")
  from cardjax.eval.cli import add_arguments as eval_arguments
  eval_arguments(p)
  decoding_args(p)
  p.set_defaults(fn=cmd_eval)

  p = sub.add_parser("import-hf", help="Hugging Face folder -> orbax checkpoint")
  p.add_argument("hf_dir", help="local HF model folder (config.json + safetensors)")
  p.add_argument("checkpoint_dir", help="orbax checkpoint folder to write")
  p.add_argument("--step", type=int, default=0, help="step number to save as (default 0)")
  p.add_argument("--param-dtype", choices=("float32", "bfloat16"), default=None,
                 help="storage dtype of the parameters (default float32)")
  p.add_argument("--scan-layers", action="store_true", help="store layers stacked for scan")
  p.add_argument("--mask-token-id", type=int, default=None,
                 help="[MASK] id to record (default: config.json's mask_token_id, else the "
                      "tokenizer's mask_token or <|mask|>, else none)")
  p.set_defaults(fn=cmd_import_hf)

  p = sub.add_parser("import-gguf", help="llama.cpp GGUF file -> orbax checkpoint")
  p.add_argument("gguf_file", help="a .gguf file (llama or qwen2; F32/F16/BF16/Q8_0/Q4_0/"
                                   "Q4_1/Q5_0/Q5_1/Q4_K/Q6_K tensors)")
  p.add_argument("checkpoint_dir", help="orbax checkpoint folder to write")
  p.add_argument("--step", type=int, default=0, help="step number to save as (default 0)")
  p.add_argument("--param-dtype", choices=("float32", "bfloat16"), default=None,
                 help="storage dtype of the parameters (default float32)")
  p.add_argument("--scan-layers", action="store_true", help="store layers stacked for scan")
  p.add_argument("--mask-token", default="",
                 help="the token MARS/CARD use as [MASK] (default: <|mask|> if present, else "
                      "the last control token the chat template does not use)")
  p.set_defaults(fn=cmd_import_gguf)

  p = sub.add_parser("export-hf", help="orbax checkpoint -> Hugging Face folder")
  p.add_argument("checkpoint_dir", help="orbax checkpoint folder (cardjax init/train/import-hf)")
  p.add_argument("hf_dir", help="HF folder to write")
  p.add_argument("--step", type=int, default=None, help="step to export (default latest)")
  p.add_argument("--dtype", choices=("float32", "bfloat16", "float16"), default=None,
                 help="tensor dtype on disk (default: the parameters' dtype)")
  p.add_argument("--max-shard-gb", type=float, default=5.0, help="largest safetensors shard")
  p.set_defaults(fn=cmd_export_hf)

  data = sub.add_parser("data", help="build and inspect datasets").add_subparsers(
      dest="data_command", required=True)
  for name, fn, text in (("build", cmd_data_build, "build a dataset and its tokenizer"),
                         ("show", cmd_data_show, "print decoded rows, loss tokens marked")):
    p = data.add_parser(name, help=text,
                        description=f"{text}. Dataset options follow as --OPTION VALUE "
                                    "(e.g. --train_size 2000 or --paths 'docs/**/*.md').")
    p.add_argument("name", help="python_stdlib | arith_sft | text_corpus | sft_jsonl")
    p.add_argument("--data_dir", default="", help="default $CARDJAX_DATA_DIR or "
                                                  "~/tensorflow_datasets")
    p.add_argument("--tokenizer_vocab", type=int, default=0, help="ids of the trained BPE")
    _config_arg(p, required=False)
    if name == "show":
      p.add_argument("--n", type=int, default=3, help="rows to print")
      p.add_argument("--split", default="", help="split (default data.split)")
    p.set_defaults(fn=fn, takes_options=True)

  p = sub.add_parser(
      "plan", help="compile the train step for a TPU slice or GPU node: memory, time",
      description="Compiles the config's real train step (no weights allocated) for a TPU "
                  "slice (v4-N, v5p-N: N TensorCores, N/2 chips; v5e-N, v6e-N: N chips; "
                  "compile-only devices from libtpu, which `make install` puts beside the venv) or a GPU "
                  "node (8xH200, 8xH100, 8xA100: simulated CPU devices, an estimate). Exit "
                  "0: fits as given; 3: fits with the grad_accum printed; 1: does not fit.")
  _config_arg(p)
  p.add_argument("--topology", required=True, help="v5p-64, v5e-16, v6e-8, v4-32, 8xH200, ...")
  p.add_argument("--mfu", type=float, default=0.4, help="assumed MFU for the step time")
  p.add_argument("--no-search", action="store_true",
                 help="do not try larger grad_accum when the step does not fit")
  p.add_argument("--json", default="", help="also write the plans to this JSON file")
  p.set_defaults(fn=cmd_plan)

  p = sub.add_parser("serve", help="serve a checkpoint over an OpenAI-compatible HTTP API")
  from cardjax.serve.cli import add_arguments as serve_arguments
  serve_arguments(p)
  p.set_defaults(fn=cmd_serve)

  p = sub.add_parser("demo", help="the main job in miniature, on CPU")
  p.add_argument("--workdir", default="runs/demo", help="where every artefact is written")
  p.set_defaults(fn=cmd_demo)
  return parser


def main(argv: list[str] | None = None) -> int:
  argv = sys.argv[1:] if argv is None else argv
  parser = build_parser()
  args, rest = parser.parse_known_args(argv)
  overrides = [a for a in rest if a.startswith("--config.")]
  unknown = [a for a in rest if not a.startswith("--config.")]
  options = None
  if getattr(args, "takes_options", False):
    options, unknown = _options(unknown)
  if unknown:
    parser.error(f"unrecognized arguments: {' '.join(unknown)}")
  logging.basicConfig(level=logging.DEBUG if args.verbose else logging.INFO,
                      format="%(asctime)s %(levelname)s %(name)s: %(message)s")
  for noisy in ("absl", "jax._src", "orbax"):
    logging.getLogger(noisy).setLevel(logging.WARNING)
  try:
    if args.fn is cmd_plan:  # before jax starts: CPU default, simulated GPU devices
      from cardjax.plan import plan_env
      plan_env(args.topology)
    from cardjax.parallel.distributed import initialize
    initialize()  # a no-op unless the environment describes a multi-process job
    code = args.fn(args, overrides) if options is None else args.fn(args, overrides, options)
  except CardjaxError as e:
    print(f"cardjax: error: {e}", file=sys.stderr)
    return 2
  return code or 0


if __name__ == "__main__":
  sys.exit(main())
