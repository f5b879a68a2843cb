"""The `cardjax` command: the table of its subcommands and `main()`.

Each subcommand is one module with `add_arguments(parser)` and `run(args) -> int | None`
(docs/cli.md: adding a command). What differs between commands is a field of the table:
whether it takes --config FILE and --config.k=v overrides, dataset options, or a step that
must run before jax starts.

Errors the user can fix print one line (`cardjax: error: ...`) and exit with status 2.
"""

from __future__ import annotations

import argparse
import dataclasses
import importlib
import logging
import sys

from cardjax import cli_flags as flags
from cardjax.errors import CardjaxError


@dataclasses.dataclass(frozen=True)
class Command:
  name: str
  module: str  # exposes add_arguments(parser) and run(args) -> int | None
  help: str
  config: str = ""  # "required" / "optional": the command takes --config FILE
  overrides: bool = False  # takes --config.k=v (args.overrides); the others refuse them
  options: bool = False  # takes free --OPTION VALUE pairs (args.options): builder options
  before_jax: bool = False  # module.before_jax(args) sets up the environment jax starts in


COMMANDS = (
    Command("config", "cardjax.config_cli", "print the resolved, validated config",
            config="required", overrides=True),
    Command("init", "cardjax.commands.init", "write a random-init orbax checkpoint for a config",
            config="required", overrides=True),
    Command("train", "cardjax.train.cli", "train (or resume) a model with a config",
            config="required", overrides=True),
    Command("generate", "cardjax.generate", "decode prompts from a checkpoint"),
    Command("eval", "cardjax.eval.cli",
            "score checkpoints: nll | arith | jsonl | --harness lm-eval tasks "
            "(docs/evaluation.md)"),
    Command("import-hf", "cardjax.commands.import_hf", "Hugging Face folder -> orbax checkpoint"),
    Command("import-gguf", "cardjax.commands.import_gguf",
            "llama.cpp GGUF file -> orbax checkpoint"),
    Command("export-hf", "cardjax.commands.export_hf", "orbax checkpoint -> Hugging Face folder"),
    Command("data", "cardjax.commands.data", "build and inspect datasets", config="optional",
            overrides=True, options=True),
    Command("plan", "cardjax.plan.cli",
            "compile the train step for a TPU slice or GPU node: memory, time",
            config="required", overrides=True, before_jax=True),
    Command("serve", "cardjax.serve.cli",
            "serve a checkpoint over an OpenAI-compatible HTTP API"),
    Command("demo", "cardjax.demo", "the main job in miniature, on CPU", overrides=True),
    Command("jobset", "cardjax.commands.jobset",
            "a Kubernetes JobSet manifest for a TPU slice or GPU node pool (docs/pods.md)",
            overrides=True),
)


def _add_arguments(parser, command: Command) -> None:
  """The module's flags, then the table's: --config on each leaf parser (data build, data
  show), and the note on underscore spellings (cardjax/cli_flags.py)."""
  importlib.import_module(command.module).add_arguments(parser)
  for p in flags.parser_tree(parser):
    leaf = not any(isinstance(a, argparse._SubParsersAction) for a in p._actions)
    if command.config and leaf:
      p.add_argument("--config", required=command.config == "required",
                     help="config file (path.py or path.py:arg); override fields with "
                          "--config.section.key=value")
    flags.add_underscore_note(p)


def build_parser(argv: list[str]) -> argparse.ArgumentParser:
  """Every command is listed; only the one argv names imports its module (some import jax,
  which must not start before a before_jax step)."""
  parser = argparse.ArgumentParser(
      prog="cardjax", allow_abbrev=False,
      description="`cardjax COMMAND --help` lists a command's flags (docs/cli.md). Errors the "
                  "user can fix print one line (cardjax: error: ...) and exit with status 2.")
  parser.add_argument("-v", "--verbose", action="store_true", help="debug logging")
  sub = parser.add_subparsers(dest="command", required=True)
  named = next((a for a in argv if not a.startswith("-")), None)
  for command in COMMANDS:
    p = sub.add_parser(command.name, help=command.help)
    if command.name == named:
      _add_arguments(p, command)
  return parser


def _configure_logging(verbose: bool) -> None:
  """cardjax's INFO lines (all of them with --verbose), other libraries' from WARNING up.
  orbax's import (through absl) has usually given the root logger a plain stderr handler
  already, which makes basicConfig a no-op: that handler gets the format instead (handlers
  others put there, such as pytest's, are left alone)."""
  root = logging.getLogger()
  fmt = logging.Formatter("%(asctime)s %(levelname)s %(name)s: %(message)s")
  if not root.handlers:
    logging.basicConfig()
  for handler in root.handlers:
    if type(handler) is logging.StreamHandler:
      handler.setFormatter(fmt)
  root.setLevel(logging.DEBUG if verbose else logging.WARNING)
  logging.getLogger("cardjax").setLevel(logging.DEBUG if verbose else logging.INFO)


def main(argv: list[str] | None = None) -> int:
  argv = sys.argv[1:] if argv is None else argv
  parser = build_parser(argv)
  known = {s for p in flags.parser_tree(parser) for s in flags.long_flags(p)}
  args, rest = parser.parse_known_args(flags.dashed(argv, known))
  command = next(c for c in COMMANDS if c.name == args.command)
  args.overrides = [a for a in rest if a.startswith("--config.")]
  unknown = [a for a in rest if not a.startswith("--config.")]
  args.options = {}
  if command.options:
    args.options, unknown = flags.free_options(unknown)
  if unknown:
    parser.error(f"unrecognized arguments: {' '.join(unknown)}")
  _configure_logging(args.verbose)
  # fsspec logs at INFO for every bucket file it opens (its read-ahead cache).
  for noisy in ("absl", "jax._src", "orbax", "fsspec"):
    logging.getLogger(noisy).setLevel(logging.WARNING)
  # google.auth warns of each credential source it tries; a bucket without credentials is
  # one cardjax error that says what to do (cardjax/storage/reach.py).
  logging.getLogger("google.auth").setLevel(logging.ERROR)
  module = importlib.import_module(command.module)
  try:
    if args.overrides and not command.overrides:
      raise CardjaxError(f"{command.name} takes no --config overrides, got {args.overrides}")
    if command.before_jax:  # e.g. plan: CPU default backend, simulated GPU devices
      module.before_jax(args)
    from cardjax.parallel.distributed import initialize
    initialize()  # a no-op unless the environment describes a multi-process job
    code = module.run(args)
  except CardjaxError as e:
    print(f"cardjax: error: {e}", file=sys.stderr)
    return 2
  return code or 0


if __name__ == "__main__":
  sys.exit(main())
