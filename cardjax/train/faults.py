"""Faults made on purpose, for the failure tests and for rehearsing a cluster's recovery
before a long run depends on it.

  CARDJAX_FAULTS="KIND@STEP[:PROCESS[:ATTEMPT]],..."

KIND is what happens just before step STEP (counted from 1, as metrics.jsonl counts) on the
process whose jax.process_index() is PROCESS (default 0):
  hang  the host stops there for good (a wedged device or a data read that never returns):
        the stall watchdog's case
  kill  the process SIGKILLs itself (a host lost: no save, no goodbye)
  term  the process sends itself SIGTERM (a preemption notice on that host)
ATTEMPT (default 0) is the launcher's attempt, CARDJAX_ATTEMPT (launch/restart.sh counts
from 0), so a restarted run does not meet the same fault again.
"""

from __future__ import annotations

import logging
import os
import signal
import threading

import jax

from cardjax.errors import ConfigError

log = logging.getLogger("cardjax.train")
KINDS = ("hang", "kill", "term")


def parse(text: str, process: int, attempt: int) -> dict[int, str]:
  """{step: kind} of the faults in `text` that are this process's in this attempt."""
  faults = {}
  for item in filter(None, (part.strip() for part in text.split(","))):
    kind, _, where = item.partition("@")
    fields = where.split(":")
    try:
      step, *rest = [int(f) for f in fields]
      if kind not in KINDS or len(rest) > 2 or step < 1:
        raise ValueError
    except ValueError:
      raise ConfigError(f"CARDJAX_FAULTS item {item!r}: expected KIND@STEP[:PROCESS[:ATTEMPT]]"
                        f" with KIND one of {', '.join(KINDS)} and STEP >= 1, e.g. "
                        "hang@5:1") from None
    on_process, on_attempt = (rest + [0, 0])[:2]
    if on_process == process and on_attempt == attempt:
      faults[step] = kind
  return faults


class Faults:
  def __init__(self, faults: dict[int, str]):
    self.faults = faults

  @classmethod
  def from_env(cls) -> "Faults":
    text = os.environ.get("CARDJAX_FAULTS", "")
    attempt = int(os.environ.get("CARDJAX_ATTEMPT", "0") or 0)
    faults = parse(text, jax.process_index(), attempt) if text else {}
    if faults:
      log.warning("CARDJAX_FAULTS: this process will %s",
                  ", ".join(f"{k} before step {s}" for s, k in sorted(faults.items())))
    return cls(faults)

  def before(self, step: int) -> None:
    kind = self.faults.get(step)
    if kind is None:
      return
    log.warning("CARDJAX_FAULTS: %s before step %d", kind, step)
    if kind == "hang":
      threading.Event().wait()  # forever: only the watchdog (or a signal) ends it
    elif kind == "kill":
      os.kill(os.getpid(), signal.SIGKILL)
    else:
      os.kill(os.getpid(), signal.SIGTERM)
