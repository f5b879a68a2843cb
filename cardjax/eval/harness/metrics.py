"""What each lm-eval task cost the cardjax model: the `cardjax` block a task gets in the
results JSON of `cardjax eval --harness`.

lm-eval hands a model every task's requests of one kind in one call, so the model counts
per task (each request names its task) and the runner reads the totals afterwards.
Generation is counted as the decode benchmark counts it (eval/measure.py): tokens are the
generated ones up to the stop token (before the `until` cut), a batched forward counts once
for each real row while that row generates (row_forwards), and seconds exclude the compile
of each new shape.
"""

from __future__ import annotations

import dataclasses


@dataclasses.dataclass
class Generated:
  requests: int = 0
  tokens: int = 0
  forwards: int = 0  # batched decoder forwards
  row_forwards: int = 0  # per real row, the forwards it was live (generating) in
  seconds: float = 0.0  # timed decode calls, compile excluded
  warmup_seconds: float = 0.0  # the first call of each new shape (compile included)

  def report(self) -> dict:
    return {**dataclasses.asdict(self),
            "tokens_per_forward": self.tokens / max(self.row_forwards, 1),
            "tokens_per_second": self.tokens / max(self.seconds, 1e-9)}


@dataclasses.dataclass
class Scored:
  """loglikelihood and loglikelihood_rolling: AR-order forwards over whole sequences."""
  requests: int = 0
  forwards: int = 0  # batched forwards (one per padded batch)
  tokens: int = 0  # positions read, padding excluded
  seconds: float = 0.0  # compile included: a forward is cheap next to generation

  def report(self) -> dict:
    return {**dataclasses.asdict(self),
            "tokens_per_second": self.tokens / max(self.seconds, 1e-9)}


class Ledger:
  """Per-task Generated and Scored totals."""

  def __init__(self):
    self.generated: dict[str, Generated] = {}
    self.scored: dict[str, Scored] = {}

  def generation(self, task: str) -> Generated:
    return self.generated.setdefault(task, Generated())

  def scoring(self, task: str) -> Scored:
    return self.scored.setdefault(task, Scored())

  def tasks(self, settings: dict) -> dict[str, dict]:
    """{task: its cardjax block}: `settings` (method, options, machine, ...) and what it
    cost, under "generate_until" and / or "loglikelihood"."""
    out: dict[str, dict] = {}
    for task, g in self.generated.items():
      out.setdefault(task, dict(settings))["generate_until"] = g.report()
    for task, s in self.scored.items():
      out.setdefault(task, dict(settings))["loglikelihood"] = s.report()
    return out
