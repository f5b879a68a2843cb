"""A profile of a running job on demand: touch WORKDIR/PROFILE, or send SIGUSR1 to any host,
and every host traces the next train.profile_on_demand_steps steps (0 = off).

Noticing. SIGUSR1 sets the host's flag; its handler is in place from the start of train(),
before the compile (SIGUSR1's default action would end the process). Process 0 looks for
WORKDIR/PROFILE in a thread of its own: every second on a local disk, every 30 s in a
bucket (each look is a bucket request; one in 30 s costs nothing).

Agreeing. Every host must trace the same steps, or the traces do not line up and the one
host that traces slows the others' collectives. Hosts notice a request at different moments
(a signal reaches one host, only process 0 reads the file), so a step each host picked on
its own (the next multiple of N after it noticed) could differ. Instead, at every metrics
line (train.log_every and the last step: steps every host passes, where the loop has just
waited for the device anyway) the hosts all-gather one flag each
(jax.experimental.multihost_utils.process_allgather); when any host was asked, every host
traces the steps after that line. That costs one tiny collective per metrics line in a job
of several processes (none in a job of one), and a request waits at most one log interval.

The trace of steps A to B goes through ProfileWindow (cardjax/train/profile.py) into
WORKDIR/profile/steps_A-B/, on host i of a job of several processes into
WORKDIR/profile/steps_A-B/process_i/ (processes on one machine would write the same file
name); for a bucket workdir, process 0's is uploaded with the metrics and each other host
uploads its own. WORKDIR/PROFILE is removed when the trace starts. A request while a trace
runs, or one whose steps would overlap the --profile-steps window, waits for a later line;
one at the last step, with no steps left, is left for a resumed run.
"""

from __future__ import annotations

import logging
import signal
import threading
from pathlib import Path

import jax
import numpy as np

from cardjax.storage import as_path, is_remote
from cardjax.train.metrics_sync import BucketSync
from cardjax.train.periodic import every
from cardjax.train.profile import ProfileWindow

log = logging.getLogger("cardjax.train")
POLL_LOCAL_S = 1.0
POLL_BUCKET_S = 30.0
FILE = "PROFILE"


class Requests:
  """The requests this host noticed: SIGUSR1, and WORKDIR/PROFILE on process 0."""

  def __init__(self, workdir: str, enabled: bool = True, poll_s: float | None = None):
    self.flag = threading.Event()
    self.lock = threading.Lock()  # a look at the file and its removal never interleave
    self.file = None
    self.previous = None
    self.stop = threading.Event()
    self.thread = None
    if not enabled:
      return
    try:
      self.previous = signal.signal(signal.SIGUSR1, lambda *_: self.flag.set())
    except ValueError:  # not the main thread: the file still works
      self.previous = None
    if jax.process_index() == 0:
      self.file = as_path(f"{str(workdir).rstrip('/')}/{FILE}")
      self.poll_s = poll_s or (POLL_BUCKET_S if is_remote(str(workdir)) else POLL_LOCAL_S)

  def start(self) -> None:
    """Process 0 starts looking for the file (after set-up: no thread of ours is running
    while the data loader may fork its workers)."""
    if self.file is not None and self.thread is None:
      self.thread = threading.Thread(target=self._poll, name="cardjax-profile-requests",
                                     daemon=True)
      self.thread.start()

  def _poll(self) -> None:
    while not self.stop.wait(self.poll_s):
      try:
        with self.lock:
          if not self.flag.is_set() and self.file.exists():
            self.flag.set()
      except Exception as e:  # a bucket that does not answer now may answer next time
        log.debug("looking for %s failed: %s", self.file, e)

  def asked(self) -> bool:
    return self.flag.is_set()

  def take(self) -> None:
    """The request is honoured: WORKDIR/PROFILE removed (process 0), the flag cleared."""
    with self.lock:
      if self.file is not None:
        try:
          if self.file.exists():
            self.file.unlink()
        except Exception as e:
          log.warning("could not remove %s (%s): remove it, or it asks for another profile",
                      self.file, e)
      self.flag.clear()

  def close(self) -> None:
    self.stop.set()
    if self.previous is not None:
      signal.signal(signal.SIGUSR1, self.previous)
      self.previous = None


def anyone_asked(asked: bool) -> bool:
  """Whether any host of the job was asked (every host calls this at the same step)."""
  if jax.process_count() == 1:
    return asked
  from jax.experimental import multihost_utils
  flags = multihost_utils.process_allgather(np.array([int(asked)], np.int32))
  return bool(np.any(flags))


class Profiles:
  """The train loop's profile action (cardjax/train/periodic.py's protocol, plus `before`
  and `close`): the --profile-steps window and the on-demand ones."""

  def __init__(self, fixed: ProfileWindow, requests: Requests, steps: int, log_every: int,
               last: int, directory: Path, workdir: str):
    self.fixed, self.requests, self.steps = fixed, requests, steps
    self.log_every, self.last_step = log_every, last
    self.directory, self.workdir = Path(directory), str(workdir).rstrip("/")
    self.window = None  # the on-demand window traced now (or from the next step)
    self.uploads = []  # a bucket workdir's other hosts' uploads of their traces
    self.waiting_logged = False
    requests.start()

  def before(self, step: int) -> None:
    self.fixed.before(step)
    if self.window is not None:
      self.window.before(step)

  def due(self, step: int) -> bool:
    return (self.fixed.due(step) or (self.window is not None and self.window.due(step))
            or (self.steps > 0 and every(self.log_every, step, self.last_step)))

  def run(self, job, step: int) -> None:
    if self.fixed.due(step):
      self.fixed.run(job, step)
    if self.window is not None and self.window.due(step):
      self.window.run(job, step)
      self._upload(self.window)
      self.window = None
    elif self.steps > 0 and self.window is None and every(self.log_every, step,
                                                          self.last_step):
      if anyone_asked(self.requests.asked()):
        self._start(step)

  def _start(self, step: int) -> None:
    first, last = step + 1, min(step + self.steps, self.last_step)
    if first > last:
      log.info("a profile was asked for at the run's last step: no steps left to trace")
      return
    fixed = self.fixed
    if fixed.tracing or (fixed.first is not None and first <= fixed.last
                         and last >= fixed.first):
      if not self.waiting_logged:
        log.info("the profile asked for waits for the end of --profile-steps %d:%d",
                 fixed.first, fixed.last)
        self.waiting_logged = True
      return
    self.requests.take()
    folder = self.directory / f"steps_{first}-{last}"
    if jax.process_count() > 1:
      folder = folder / f"process_{jax.process_index()}"
    self.window = ProfileWindow((first, last), folder, start=step)
    log.info("profiling steps %d:%d on every host, as asked, into %s", first, last, folder)

  def _upload(self, window: ProfileWindow) -> None:
    """Another host's trace to a bucket workdir (process 0's goes with the metrics)."""
    if not is_remote(self.workdir) or jax.process_index() == 0:
      return
    rel = window.directory.relative_to(self.directory)
    sync = BucketSync(window.directory, f"{self.workdir}/profile/{rel.as_posix()}")
    sync.request()
    self.uploads.append(sync)

  def close(self) -> None:
    self.fixed.close()
    if self.window is not None:
      self.window.close()
    for sync in self.uploads:
      sync.close()
    self.requests.close()
