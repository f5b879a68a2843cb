"""`cardjax train --config F --workdir D [--config.k=v ...]`: train a model, or resume it."""

from __future__ import annotations

import sys


def add_arguments(p) -> None:
  p.add_argument("--workdir", required=True, help="run folder: checkpoints, metrics.jsonl, "
                                                  "tensorboard/; an existing run resumes")


def run(args) -> int:
  import jax

  from cardjax.config import load_config
  from cardjax.train import Preempted, train

  config = load_config(args.config, args.overrides)
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
