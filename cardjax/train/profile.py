"""A profile of a window of train steps: `cardjax train --profile-steps A:B` (or
`--config.train.profile_steps=A:B`) traces steps A to B into WORKDIR/profile.

Steps are numbered as metrics.jsonl and the checkpoints number them: step 1 is the first
update (and holds the compile). The trace starts just before step A is dispatched and stops
once step B's results are on the host, so it holds all of B's device work. jax.profiler
writes WORKDIR/profile/plugins/profile/<time>/<host>.xplane.pb, which TensorBoard's profile
plugin opens (docs/training.md, "Profiling").
"""

from __future__ import annotations

import logging
import re
from pathlib import Path

import jax

from cardjax.errors import ConfigError

log = logging.getLogger("cardjax.train")


def parse_steps(text: str, total: int | None = None) -> tuple[int, int] | None:
  """(A, B) of "A:B" (1 <= A <= B, and B <= total when given); None for ""."""
  if not text:
    return None
  match = re.fullmatch(r"\s*(\d+)\s*:\s*(\d+)\s*", str(text))
  if not match:
    raise ConfigError(f"profile steps {text!r} are not A:B: write the first and last step "
                      "to trace, e.g. --profile-steps 10:12")
  first, last = int(match[1]), int(match[2])
  if not 1 <= first <= last:
    raise ConfigError(f"profile steps {text!r}: need 1 <= A <= B (steps count from 1, as "
                      "in metrics.jsonl), e.g. --profile-steps 10:12")
  if total is not None and last > total:
    raise ConfigError(f"profile steps {text!r} end after train.steps={total}: pick B <= "
                      f"{total}")
  return first, last


class ProfileWindow:
  """Starts the trace before the window's first step and stops it after its last; as a
  periodic action (cardjax/train/periodic.py) it is due at the last step."""

  def __init__(self, steps: tuple[int, int] | None, directory: Path, start: int):
    self.directory = Path(directory)
    self.tracing = False
    self.first = self.last = None
    if steps is None:
      return
    first, last = steps
    # A resumed run traces what is left of the window.
    self.first, self.last = max(first, start + 1), last
    if self.first > self.last:
      log.warning("profile steps %d:%d were done before the resumed step %d: no profile",
                  first, last, start)
      self.first = self.last = None
    elif self.first > first:
      log.warning("resumed at step %d: profiling steps %d:%d", start, self.first, last)

  def before(self, step: int) -> None:
    if step == self.first:
      jax.profiler.start_trace(str(self.directory))
      self.tracing = True

  def due(self, step: int) -> bool:
    return step == self.last

  def run(self, job, step: int) -> None:
    # Dispatch is asynchronous: wait for the step's results, or the trace ends early.
    jax.block_until_ready((job.params, job.opt_state, job.metrics))
    self.close()
    log.info("profile of steps %d:%d in %s; open it with `tensorboard --logdir %s`, Profile "
             "tab (pip install tensorboard xprof)", self.first, self.last, self.directory,
             self.directory)

  def close(self) -> None:
    """Stops a trace still running (a NaN stop or SIGTERM inside the window): what it
    holds is still written."""
    if self.tracing:
      self.tracing = False
      jax.profiler.stop_trace()
