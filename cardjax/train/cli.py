"""`cardjax train --config F --workdir D [--profile-steps A:B] [--config.k=v ...]`: train a
model, or resume it."""

from __future__ import annotations

import argparse
import sys


def _profile_steps(text: str) -> str:
  from cardjax.errors import ConfigError
  from cardjax.train.profile import parse_steps

  try:
    parse_steps(text)
  except ConfigError as e:
    raise argparse.ArgumentTypeError(str(e)) from None
  return text


def add_arguments(p) -> None:
  p.add_argument("--workdir", required=True, help="run folder: checkpoints, metrics.jsonl, "
                                                  "tensorboard/; an existing run resumes; "
                                                  "a local path, gs://B/P or s3://B/P "
                                                  "(docs/storage.md)")
  p.add_argument("--profile-steps", type=_profile_steps, default=None, metavar="A:B",
                 help="trace steps A to B (counted from 1, as in metrics.jsonl) into "
                      "WORKDIR/profile for TensorBoard's profile plugin; the same as "
                      "--config.train.profile_steps=A:B")


def run(args) -> int:
  import jax

  from cardjax.config import load_config
  from cardjax.storage import check, resolve
  from cardjax.train import Preempted, exit_codes, train, trackers
  from cardjax.train.profile import parse_steps

  args.workdir = resolve(args.workdir)  # relative local paths: once, here
  check(args.workdir)  # an unusable bucket fails before a dataset build or a compile
  overrides = list(args.overrides)
  if args.profile_steps is not None:  # the flag is this override, spelled shorter
    overrides.append(f"--config.train.profile_steps={args.profile_steps}")
  config = load_config(args.config, overrides)
  parse_steps(config.train.profile_steps, config.train.steps)  # before a dataset build
  trackers.check(config.train.trackers)  # (wandb installed?) and so is this
  if jax.process_count() == 1:  # one process: build a missing dataset, as tfds.load does
    from cardjax.data.prepare import prepare
    prepare(config)  # (hosts of a pod job would race on a shared data_dir: they build first)
  try:
    result = train(config, args.workdir)
  except Preempted as e:
    print(f"cardjax: {e}", file=sys.stderr)
    return exit_codes.PREEMPTED
  train_m, eval_m = result["train"], result["eval"]
  start, step = result["start"], result["step"]
  done = (f"resumed from step {start}, trained {step - start} steps to step {step}" if start
          else f"trained {step} steps")
  print(f"{done}: loss {train_m.get('loss', float('nan')):.4f}; "
        f"validation loss {eval_m.get('loss', float('nan')):.4f}, "
        f"AR NLL {eval_m.get('ar_nll', float('nan')):.4f}; {args.workdir}")
  return 0
