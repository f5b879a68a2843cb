"""`cardjax config --config F [--config.k=v ...]`: print the resolved, validated config."""

from __future__ import annotations


def add_arguments(p) -> None:
  """None of its own: --config and its overrides are the command table's (cardjax/cli.py)."""


def run(args) -> None:
  from cardjax.config import load_config

  print(load_config(args.config, args.overrides))
