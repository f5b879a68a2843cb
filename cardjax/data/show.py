"""`cardjax data show`: decoded examples, with the tokens that carry loss made visible."""

from __future__ import annotations

import numpy as np

from cardjax.data.pipeline import PipelineSpec, make_dataset
from cardjax.data.tokenizer import Tokenizer

LOSS_OPEN, LOSS_CLOSE = "\u27e6", "\u27e7"  # ⟦response tokens⟧


def mark_loss(tokenizer: Tokenizer, ids, mask) -> str:
  """Decode ids, wrapping every run of loss-carrying tokens in ⟦ ⟧."""
  out, run, on = [], [], None
  for token, weight in zip(np.asarray(ids).tolist(), np.asarray(mask).tolist()):
    if on is not None and bool(weight) != on:
      text = tokenizer.decode(run)
      out.append(f"{LOSS_OPEN}{text}{LOSS_CLOSE}" if on else text)
      run = []
    run.append(token)
    on = bool(weight)
  if run:
    text = tokenizer.decode(run)
    out.append(f"{LOSS_OPEN}{text}{LOSS_CLOSE}" if on else text)
  return "".join(out)


def show_rows(source, tokenizer: Tokenizer, spec: PipelineSpec, n: int) -> list[str]:
  """The first n rows as the pipeline makes them (unshuffled, one host)."""
  spec = PipelineSpec(**{**spec.__dict__, "batch_size": 1, "shuffle": False, "num_epochs": 1,
                         "num_workers": 0})
  rows = []
  for batch in make_dataset(source, tokenizer, spec, 0, 1):
    tokens, mask, segments = batch["tokens"][0], batch["loss_mask"][0], batch["segment_ids"][0]
    used = int((segments > 0).sum())
    header = (f"-- row {len(rows)}: {used}/{len(tokens)} tokens used, "
              f"{len(set(segments[segments > 0].tolist()))} segment(s), "
              f"{int(mask.sum())} with loss")
    rows.append(header + "\n" + mark_loss(tokenizer, tokens[:used], mask[:used]))
    if len(rows) == n:
      break
  return rows
