"""How the `cardjax` command spells its flags (cardjax/cli.py applies these to every command).

Flags are spelled with dashes (--data-dir). The underscore spellings of the same flags
(--data_dir, the old spelling of some) are rewritten to the dashed ones before argparse
sees them, for one release, and each --help says so. --config.k_v overrides and dataset
builder options are not flags of a parser: they keep their names.
"""

from __future__ import annotations

import argparse


def parser_tree(parser: argparse.ArgumentParser):
  """The parser and those of its own subcommands (data build, data show)."""
  yield parser
  for action in parser._actions:
    if isinstance(action, argparse._SubParsersAction):
      for sub in action.choices.values():
        yield from parser_tree(sub)


def long_flags(parser: argparse.ArgumentParser) -> list[str]:
  return [s for a in parser._actions for s in a.option_strings if s.startswith("--")]


def add_underscore_note(parser: argparse.ArgumentParser) -> None:
  """The one-release note in the epilog of a --help that has a dashed flag."""
  flags = [s for s in long_flags(parser) if "-" in s[2:]]
  if flags:
    note = (f"Flags are spelled with dashes ({flags[0]}); the underscore spellings "
            f"(--{flags[0][2:].replace('-', '_')}) are accepted until the next release.")
    parser.epilog = f"{parser.epilog}\n\n{note}" if parser.epilog else note


def dashed(argv: list[str], flags) -> list[str]:
  """--data_dir -> --data-dir (also --data_dir=D) where --data-dir is one of `flags`."""
  out = []
  for i, arg in enumerate(argv):
    if arg == "--":  # what follows is not flags
      return out + argv[i:]
    name, eq, value = arg.partition("=")
    if name.startswith("--") and "_" in name and "--" + name[2:].replace("_", "-") in flags:
      arg = "--" + name[2:].replace("_", "-") + eq + value
    out.append(arg)
  return out


def free_options(rest: list[str]) -> tuple[dict, list[str]]:
  """Dataset builder options written --key value or --key=value, and what is not one; the
  builder checks the names. --train-size is the builder's train_size."""
  found, unknown, i = {}, [], 0
  while i < len(rest):
    arg = rest[i]
    if arg.startswith("--") and "=" in arg:
      key, value = arg[2:].split("=", 1)
      found[key.replace("-", "_")] = value
    elif arg.startswith("--") and i + 1 < len(rest) and not rest[i + 1].startswith("--"):
      found[arg[2:].replace("-", "_")] = rest[i + 1]
      i += 1
    else:
      unknown.append(arg)
    i += 1
  return found, unknown
