"""The train step of several objectives on one model and batch, timed in interleaved rounds.

Every round runs a few steps of each objective in turn (the order rotated round by round), so
a shared machine's drift over minutes moves every objective of a round alike; each round
gives one ratio per pair, and the report keeps their median and range. The steps are the
study's own (benchmarks/studies/forked_wsd.py: cardjax's jitted train step), on the first
batch of the study's training rows.
"""

from __future__ import annotations

import statistics
import time

import jax

# (label, numerator, denominator): the papers' claims (CARD at AR's cost, BD3LM about 3x
# CARD) and MDLM's cost beside AR's
RATIOS = (("card_over_ar", "card", "ar"), ("bd3lm_over_card", "bd3lm", "card"),
          ("mdlm_over_ar", "mdlm", "ar"))


def step_times(configs: dict, rows: dict, rounds: int, steps: int = 5,
               ratios=RATIOS) -> dict:
  """{"seconds": {name: [per round]}, ratio: median, "spread": {ratio: [low, high]}} for
  `configs` ({name: config}) on the first batch of `rows`; `ratios`: (label, numerator,
  denominator) names."""
  from benchmarks.studies.forked_wsd import Model, Rows

  models = {name: Model(config) for name, config in configs.items()}
  batch = Rows(rows, next(iter(configs.values())).data.batch_size, 0).at(0)
  state = {name: (m.params, m.opt_state) for name, m in models.items()}

  def run(name: str, count: int) -> float:
    params, opt_state = state[name]
    start = time.perf_counter()
    for i in range(count):
      params, opt_state, metrics = models[name].train(params, opt_state, batch, i, 1e-4)
    jax.block_until_ready(metrics["loss"])
    state[name] = (params, opt_state)
    return (time.perf_counter() - start) / count

  for name in models:  # compile and warm
    run(name, 2)
  names = list(models)
  seconds = {name: [] for name in names}
  for r in range(rounds):
    for name in names[r % len(names):] + names[:r % len(names)]:
      seconds[name].append(run(name, steps))
  out: dict = {"seconds": seconds, "steps_per_round": steps, "spread": {}}
  for label, top, bottom in ratios:
    if top in seconds and bottom in seconds:
      ratios = [a / b for a, b in zip(seconds[top], seconds[bottom])]
      out[label] = statistics.median(ratios)
      out["spread"][label] = [min(ratios), max(ratios)]
  return out
