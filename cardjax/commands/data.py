"""`cardjax data build|show NAME [--data-dir D] [--OPTION VALUE ...]`: build a dataset and its
tokenizer, or print decoded rows with the loss-carrying tokens marked.

Dataset builder options follow the flags as --OPTION VALUE (cardjax/cli.py collects them
into args.options; the builder checks their names).
"""

from __future__ import annotations

ACTIONS = {"build": "build a dataset and its tokenizer",
           "show": "print decoded rows, loss tokens marked"}


def add_arguments(p) -> None:
  sub = p.add_subparsers(dest="data_command", required=True)
  for action, text in ACTIONS.items():
    q = sub.add_parser(action, help=text,
                       description=f"{text}. Dataset options follow as --OPTION VALUE "
                                   "(e.g. --train-size 2000 or --paths 'docs/**/*.md').")
    q.add_argument("name", help="python_stdlib | arith_sft | text_corpus | sft_jsonl")
    q.add_argument("--data-dir", default="", help="default $CARDJAX_DATA_DIR or "
                                                  "~/tensorflow_datasets")
    q.add_argument("--tokenizer-vocab", type=int, default=0, help="ids of the trained BPE")
    if action == "build":
      q.add_argument("--beam-runner", default="",
                     help="build on Apache Beam with this runner: DirectRunner, "
                          "DataflowRunner, FlinkRunner, SparkRunner (not arith_sft)")
      q.add_argument("--beam-options", default="",
                     help="the runner's pipeline options as one quoted string (docs/data.md "
                          "has them for DirectRunner, Dataflow, Flink and Spark)")
    if action == "show":
      q.add_argument("--n", type=int, default=3, help="rows to print")
      q.add_argument("--split", default="", help="split (default data.split)")


def run(args) -> None:
  (build if args.data_command == "build" else show)(args)


def _config(args):
  from cardjax.config import base_config, load_config

  config = load_config(args.config, args.overrides) if args.config else base_config()
  config.data.dataset = args.name
  if args.options:
    config.data.options = {**config.data.options.to_dict(), **args.options}
  if args.data_dir:
    config.data.data_dir = args.data_dir
  if args.tokenizer_vocab:
    config.data.tokenizer_vocab = args.tokenizer_vocab
  return config


def build(args) -> None:
  from cardjax.data import builders
  from cardjax.data.prepare import data_dir, prepare

  config = _config(args)
  if args.beam_options and not args.beam_runner:
    from cardjax.errors import ConfigError
    raise ConfigError("--beam-options needs --beam-runner (e.g. --beam-runner DirectRunner)")
  builder, tokenizer = prepare(config, beam_runner=args.beam_runner or None,
                               beam_options=args.beam_options)
  splits = {k: v.num_examples for k, v in builder.info.splits.items()}
  print(f"{args.name}: {splits} in {builders.location(builder, data_dir(config))}")
  print(f"tokenizer: {tokenizer.vocab_size} ids, [MASK]={tokenizer.mask_id}, "
        f"EOS={tokenizer.eos_id} ({tokenizer.source or data_dir(config)})")


def show(args) -> None:
  from cardjax.data import builders
  from cardjax.data.prepare import data_dir, load_data_tokenizer, pipeline_spec
  from cardjax.data.show import show_rows

  config = _config(args)
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
