"""Time-based checkpoints: a save every train.checkpoint_minutes, besides the step-based
ones, so a long run loses at most that much work to a crash that gives no warning (a
preemption warns: cardjax/train/preemption.py). Such a save is kept only until a newer step
exists (cardjax/train/checkpointing.py's retention).

Every host must save at the same step, and hosts' clocks and paces differ a little, so the
minutes become a number of steps that all hosts agree on: process 0's pace since the last
agreement, broadcast to the others at a step every host reaches (the first after
CALIBRATE_STEPS steps, then each timed save). In one process the broadcast is a no-op.
"""

from __future__ import annotations

import logging
import time

import jax
import numpy as np

log = logging.getLogger("cardjax.train")
CALIBRATE_STEPS = 10  # steps measured before the first agreement (the first one compiles)


class TimedSave:
  def __init__(self, minutes: float, start: int, finite):
    self.seconds, self.finite = minutes * 60.0, finite
    self.calibrate_at = start + 1 + CALIBRATE_STEPS
    self.mark: tuple[float, int] | None = None  # (time, step) the pace is measured from
    self.next: int | None = None  # the agreed step of the next timed save

  def due(self, step: int) -> bool:
    if self.seconds <= 0:
      return False
    if self.mark is None:  # the first step (and its compile) is not the run's pace
      self.mark = (time.monotonic(), step)
      return False
    return step == self.calibrate_at or (self.next is not None and step >= self.next)

  def run(self, job, step: int) -> None:
    if self.next is not None and step >= self.next and job.last_saved != step:
      self.finite.now()  # never a NaN step
      with job.times.adding("aside"):  # not step time (goodput)
        job.save(step)
      log.info("step %d: time-based checkpoint (train.checkpoint_minutes=%g)", step,
               self.seconds / 60)
    now = time.monotonic()
    pace = (now - self.mark[0]) / max(step - self.mark[1], 1)
    steps = _agreed(max(1, round(self.seconds / max(pace, 1e-9))))
    self.mark, self.next = (now, step), step + steps


def _agreed(steps: int) -> int:
  """Process 0's number of steps, on every host."""
  if jax.process_count() == 1:
    return steps
  from jax.experimental import multihost_utils
  return int(multihost_utils.broadcast_one_to_all(np.int32(steps)))
