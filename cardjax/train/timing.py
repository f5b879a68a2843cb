"""Where the train loop's time goes, for each metrics line and for goodput.

The loop dispatches step n, then reads step n-1's loss (the NaN check), so the host waits
for the device there and the device always has a step queued. Per step, over a metrics
line's interval:

  step_s         wall time per step (as tokens/s counts it: validation at a metrics line
                 is left out)
  data_wait_s    time in next(loader): the host waiting for data
  device_wait_s  time blocked on the device's results (the NaN check, the line's own read)
  host_s         the rest, step_s - data_wait_s - device_wait_s: the host's own work
                 (dispatch, the periodic actions: checkpoints, the progress bar, ...)

A fast input pipeline and an asynchronous loop show data_wait_s and host_s near 0 and
device_wait_s near step_s: the device is the bottleneck, as it should be.

`step_done` also gives each step's own time to the goodput ledger (cardjax/train/goodput.py):
the time since the previous step ended, less the checkpoints and validations in between
(`aside`), which are not step time.
"""

from __future__ import annotations

import contextlib
import time


class StepTimes:
  def __init__(self, clock=time.perf_counter):
    self.clock = clock
    # Seconds since the run started, each only ever growing.
    self.data_wait = 0.0
    self.device_wait = 0.0
    self.aside = 0.0  # checkpoints and validations
    self.ledger = None  # the run's goodput.Ledger on process 0 (set by train)
    self.line_marks = (0.0, 0.0)  # data_wait, device_wait at the last metrics line
    self.step_end = None  # when the previous step ended (None: none yet)
    self.aside_mark = 0.0  # aside then

  @contextlib.contextmanager
  def adding(self, name: str):
    """Adds the time of the `with` block to counter `name` (data_wait, device_wait, aside)."""
    start = self.clock()
    try:
      yield
    finally:
      setattr(self, name, getattr(self, name) + self.clock() - start)

  def line(self, steps: int, seconds: float) -> dict:
    """A metrics line's figures for its interval: `steps` steps in `seconds` wall time."""
    data, device = (self.data_wait - self.line_marks[0], self.device_wait - self.line_marks[1])
    self.line_marks = (self.data_wait, self.device_wait)
    steps = max(steps, 1)
    step_s = seconds / steps
    return {"step_s": step_s, "data_wait_s": data / steps, "device_wait_s": device / steps,
            "host_s": step_s - (data + device) / steps}

  def step_done(self, step: int) -> None:
    """Step `step` and the periodic actions after it are done."""
    now = self.clock()
    if self.ledger is not None:
      seconds = None if self.step_end is None else (
          now - self.step_end - (self.aside - self.aside_mark))
      self.ledger.step(step, seconds, time.time())
    self.step_end, self.aside_mark = now, self.aside
