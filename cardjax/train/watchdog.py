"""The stall watchdog: a run in which no step finishes for too long ends itself.

A hung host (a wedged device, a data read that never returns, a peer lost inside a
collective) stops every host of a job, none of them with an error: the job would hold its
machines and do nothing until a person looks. The watchdog is a thread that the loop tells
of each finished step (`beat`). When none comes within the limit it writes why to the log,
dumps the stack of every thread (where the host hung: a collective, the data loader, a
bucket read), and ends the process with exit status 75, which the launchers restart. Each
host runs its own, so on the hung host and on the hosts waiting for it alike, the log shows
the stacks.

The limit (train.stall_timeout, seconds): 0 picks it from the run's own pace, 20 times the
median time between steps and never under 10 minutes (a checkpoint or a validation between
steps is slow but not a stall); until the first step finishes, which includes compiling it,
train.stall_first_timeout applies. A negative limit turns the watchdog off.
"""

from __future__ import annotations

import faulthandler
import logging
import os
import statistics
import sys
import threading
import time

from cardjax.train.exit_codes import STALLED

log = logging.getLogger("cardjax.train")
AUTO_FLOOR_S = 600.0
AUTO_FACTOR = 20.0
WINDOW = 50  # step intervals the median is taken over
STALL_EXIT_DELAY_S = 10.0  # each host of a job, after its dump (see StallWatchdog)


def exit_delay(process_index: int, process_count: int) -> float:
  """How long a host waits after its dump before it exits (see StallWatchdog)."""
  if process_count == 1:
    return 0.0
  return STALL_EXIT_DELAY_S * (2 if process_index == 0 else 1)


class StallWatchdog:
  def __init__(self, timeout: float, first_timeout: float, exit=os._exit,
               exit_delay: float = 0.0):
    self.timeout, self.first_timeout = float(timeout), float(first_timeout)
    self.exit = exit  # how the process ends (a test passes its own)
    # A host that ends breaks the others' collectives (and process 0's end, their
    # runtime), which would end them with an error instead of their own stacks and status.
    # Each host of a job finds the stall within a step of the others, so each waits this
    # long after its dump (every host has written its stacks before the first one leaves),
    # and process 0, which holds the coordination service, twice as long (it leaves last).
    self.exit_delay = exit_delay
    self.intervals: list[float] = []
    self.last = time.monotonic()
    self.steps = 0
    self.done = threading.Event()
    self.thread = None

  @property
  def enabled(self) -> bool:
    return self.timeout >= 0

  def limit(self) -> float:
    """Seconds allowed from the last finished step (or the start) to the next."""
    if self.steps == 0:
      return self.first_timeout
    if self.timeout > 0:
      return self.timeout
    if len(self.intervals) < 3:  # the pace is not known yet
      return max(AUTO_FLOOR_S, self.first_timeout)
    return max(AUTO_FLOOR_S, AUTO_FACTOR * statistics.median(self.intervals))

  def beat(self) -> None:
    """A step finished."""
    now = time.monotonic()
    if self.steps:
      self.intervals = (self.intervals + [now - self.last])[-WINDOW:]
    self.last, self.steps = now, self.steps + 1

  def __enter__(self):
    self.last = time.monotonic()
    if self.enabled:
      self.thread = threading.Thread(target=self._watch, name="cardjax-stall-watchdog",
                                     daemon=True)
      self.thread.start()
    return self

  def __exit__(self, *exc):
    self.done.set()
    if self.thread is not None:
      self.thread.join()

  def _watch(self) -> None:
    while not self.done.wait(min(1.0, max(self.limit() / 10, 0.05))):
      waited, limit = time.monotonic() - self.last, self.limit()
      if waited > limit:
        self._stalled(waited, limit)
        return

  def _stalled(self, waited: float, limit: float) -> None:
    log.error("stalled: no training step finished for %.0f s (limit %.0f s, "
              "train.stall_timeout) after %d steps in this process; the stack of every "
              "thread follows; exiting with status %d for the launcher to restart", waited,
              limit, self.steps, STALLED)
    try:
      for stream in logging.getLogger().handlers + log.handlers + [sys.stderr]:
        try:
          stream.flush()
        except (AttributeError, ValueError, OSError):  # a stream closed under us
          pass
      for out in (sys.stderr, sys.__stderr__):  # the first that has a file descriptor
        try:
          faulthandler.dump_traceback(file=out, all_threads=True)
          out.flush()
          break
        except (AttributeError, ValueError, OSError):
          continue
    finally:  # whatever the dump met, the process ends
      time.sleep(self.exit_delay)
      self.exit(STALLED)
