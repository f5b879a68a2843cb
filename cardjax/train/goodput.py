"""Goodput: the share of a run's wall time spent in steps that were kept, over every attempt
(each start or restart of the same workdir).

WORKDIR/goodput.json, written by process 0 at each metrics line and at the end (and
uploaded with the metrics for a bucket workdir, read back by the next attempt), holds one
record per attempt:

  attempt       CARDJAX_ATTEMPT, the launcher's count of restarts (null when unset)
  start, end    unix times: train() entered, the newest record (the end at a clean end)
  resumed_from  the checkpoint step it resumed from (0: a new run)
  last_step     the highest step it finished
  startup_s     from start to the end of its first step: set-up, restore, compile
  productive_s  its steps above every earlier attempt's last_step: kept work
  lost_s, lost_steps  its steps at or below that: work done before, lost to a restart from
                an older checkpoint, and redone (lost_steps counts each; the time of an
                attempt's first step is start-up either way)

A step's time is from the end of the step before to its own end (data, dispatch, the wait
for the device, the progress bar and metrics), less the checkpoints and validations in
between (cardjax/train/timing.py). Wall time is the sum of the attempts' (end - start) plus,
before an attempt its launcher restarted (CARDJAX_ATTEMPT > 0), the gap since the previous
attempt's end: the time the restart itself took. A new command (CARDJAX_ATTEMPT unset or 0)
starts without counting the time since the last one, which a person chose. goodput is
productive_s over that wall time. A killed attempt's record ends at its last metrics line:
the steps after it count as productive again when redone, by at most one log interval.
"""

from __future__ import annotations

import json
import logging
import os
from pathlib import Path

log = logging.getLogger("cardjax.train")
FILE = "goodput.json"


def attempt_from_env() -> int | None:
  """CARDJAX_ATTEMPT as an int (launch/restart.sh, the JobSet's restart count); None when
  unset or not a number."""
  try:
    return int(os.environ["CARDJAX_ATTEMPT"])
  except (KeyError, ValueError):
    return None


class Ledger:
  def __init__(self, attempts: list[dict] | None = None, path: Path | None = None):
    self.attempts = [dict(a) for a in attempts or []]
    self.path = path  # where save() writes (None: nowhere)
    self.current = None  # this attempt's record
    self.reached = 0  # the highest step an earlier attempt finished
    self.stepped = False  # this attempt finished a step

  @classmethod
  def open(cls, directory: str | os.PathLike) -> Ledger:
    """The ledger of `directory`/goodput.json (empty when there is none or it is
    unreadable)."""
    path = Path(directory) / FILE
    attempts = []
    if path.exists():
      try:
        attempts = json.loads(path.read_text())["attempts"]
      except (ValueError, KeyError, TypeError) as e:
        log.warning("%s is unreadable (%s): goodput counts from this attempt on", path, e)
    return cls(attempts, path)

  def begin(self, start_step: int, now: float, attempt: int | None) -> None:
    """A new attempt, resumed from checkpoint `start_step` (0: a new run), started at unix
    time `now`."""
    self.reached = max([a["last_step"] for a in self.attempts], default=0)
    self.current = {"attempt": attempt, "start": now, "end": now, "resumed_from": start_step,
                    "last_step": start_step, "startup_s": 0.0, "productive_s": 0.0,
                    "lost_s": 0.0, "lost_steps": 0}
    self.attempts.append(self.current)
    self.stepped = False

  def step(self, step: int, seconds: float | None, now: float) -> None:
    """Step `step` ended at unix time `now` after `seconds` of its own (None, or anything,
    for the attempt's first step: its time is start-up)."""
    a = self.current
    if step <= self.reached:
      a["lost_steps"] += 1
    if not self.stepped:
      a["startup_s"] = now - a["start"]
      self.stepped = True
    elif step <= self.reached:
      a["lost_s"] += seconds
    else:
      a["productive_s"] += seconds
    a["last_step"] = max(a["last_step"], step)
    a["end"] = now

  def totals(self, now: float | None = None) -> dict:
    """Sums over the attempts; `now` extends the current attempt to that time."""
    wall = restarts = 0.0
    previous_end = None
    for a in self.attempts:
      end = max(a["end"], now) if (a is self.current and now is not None) else a["end"]
      wall += end - a["start"]
      if previous_end is not None and (a["attempt"] or 0) > 0:
        restarts += max(0.0, a["start"] - previous_end)
      previous_end = end
    sums = {k: sum(a[k] for a in self.attempts)
            for k in ("startup_s", "productive_s", "lost_s", "lost_steps")}
    wall += restarts
    other = wall - restarts - sums["startup_s"] - sums["productive_s"] - sums["lost_s"]
    return {"wall_s": wall, "restart_s": restarts, "other_s": other, **sums,
            "attempts": len(self.attempts),
            "goodput": sums["productive_s"] / wall if wall > 0 else 0.0}

  def goodput(self, now: float | None = None) -> float:
    return self.totals(now)["goodput"]

  def save(self) -> None:
    """Writes the ledger (a new file renamed into place: never half written)."""
    if self.path is None:
      return
    tmp = self.path.with_name(self.path.name + ".tmp")
    tmp.write_text(json.dumps({"attempts": self.attempts}, indent=1) + "\n")
    os.replace(tmp, self.path)

  def summary(self, now: float | None = None) -> str:
    t = self.totals(now)
    return (f"goodput {t['goodput']:.1%}: {t['productive_s']:.1f} s in kept steps of "
            f"{t['wall_s']:.1f} s over {t['attempts']} attempt(s) (start-up and compiles "
            f"{t['startup_s']:.1f} s, redone steps {t['lost_s']:.1f} s ({t['lost_steps']} "
            f"steps), restarts {t['restart_s']:.1f} s, checkpoints, validation and the rest "
            f"{t['other_s']:.1f} s)")

  def close(self, now: float) -> str:
    """The attempt ends at unix time `now`: the last record, and its summary line."""
    if self.current is not None:
      self.current["end"] = max(self.current["end"], now)
    self.save()
    return self.summary()
