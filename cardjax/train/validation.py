"""The trainer's validation: the fixed batches it scores and the mean of its eval step
over them. `cardjax train` runs it every train.eval_every steps; `cardjax eval --task nll`
(cardjax/eval/nll.py) runs the same pieces on a checkpoint, so the two numbers agree."""

from __future__ import annotations

import jax
import jax.numpy as jnp

from cardjax.data.pipeline import to_global
from cardjax.data.prepare import make_loader


def eval_batches(config) -> list[dict]:
  """This host's rows of the first train.eval_steps batches of the unshuffled validation
  split, read once per run and kept in host memory: every validation scores the same
  batches, so one loader (and one tokenizer load) serves them all."""
  # One data shard per host: the validation split is small and never resumed.
  with make_loader(config, split=config.data.eval_split, shuffle=False, shards=0) as loader:
    return [next(loader) for _ in range(config.train.eval_steps)]


def evaluate(eval_fn, params, batches, mesh, frozen=None) -> dict:
  """Mean objective loss and AR NLL over the fixed validation batches (eval_fn: the
  jitted cardjax.train.step.make_eval_step; frozen: the weights params do not hold)."""
  totals: dict = {}
  for index, batch in enumerate(batches):
    out = jax.device_get(eval_fn(params, to_global(batch, mesh), jnp.int32(index),
                                 {} if frozen is None else frozen))
    for k, v in out.items():
      totals[k] = totals.get(k, 0.0) + float(v)
  return {k: v / len(batches) for k, v in totals.items()}
