"""Experiment trackers, `train.trackers` (comma-separated; "" = none): each gets every line
metrics.jsonl gets (train and eval, the same keys and steps), from process 0 only.

wandb: Weights & Biases, an optional dependency (`pip install 'cardjax[wandb]'`), checked
before any work. The run's W&B id is kept in WORKDIR/wandb.json, so every attempt of a run
(a resume, a launcher's restart, on any machine: a bucket workdir's copy is read back) logs
to the same W&B run, in project train.wandb_project, named after the workdir. W&B keeps its
own files in WANDB_DIR when set, else in WORKDIR/wandb (a bucket workdir's staging folder,
never uploaded with the metrics). WANDB_MODE=offline writes the run there for a later
`wandb sync`. W&B drops steps at or below the newest it has, so after a restart from an
older checkpoint the redone steps are in metrics.jsonl but not logged again in W&B.
"""

from __future__ import annotations

import importlib.util
import json
import logging
import os
import secrets
import string
from pathlib import Path

from cardjax.config import TRACKERS, tracker_names
from cardjax.errors import CardjaxError

log = logging.getLogger("cardjax.train")


def check(text: str) -> list[str]:
  """The names in `text`, each one's package installed (before any work)."""
  names = tracker_names(text)
  for name in names:
    if importlib.util.find_spec(name) is None:
      raise CardjaxError(f"config train.trackers={text!r}: the {name} package is not "
                         f"installed; {TRACKERS[name]}")
  return names


def make(config, directory: str | os.PathLike, workdir: str) -> list:
  """The trackers of config.train.trackers; `directory` is the run's local folder (its
  state files), `workdir` the run's own path (its name)."""
  return [WandbTracker(config, Path(directory), workdir)
          for name in check(config.train.trackers) if name == "wandb"]


def _new_id() -> str:
  # W&B's own ids: 8 characters of lowercase letters and digits.
  return "".join(secrets.choice(string.ascii_lowercase + string.digits) for _ in range(8))


class WandbTracker:
  def __init__(self, config, directory: Path, workdir: str):
    import wandb

    state = directory / "wandb.json"
    saved = json.loads(state.read_text()) if state.exists() else {}
    self.id = saved.get("id") or _new_id()
    files = Path(os.environ.get("WANDB_DIR") or directory / "wandb")
    files.mkdir(parents=True, exist_ok=True)
    self.run = wandb.init(project=config.train.wandb_project, id=self.id, resume="allow",
                          name=str(workdir).rstrip("/").rsplit("/", 1)[-1],
                          config=config.to_dict(), dir=str(files))
    state.write_text(json.dumps({"id": self.id, "project": config.train.wandb_project}) + "\n")
    if saved.get("id"):
      log.info("W&B: resuming run %s", self.id)
    self.failed = False

  def log(self, step: int, values: dict) -> None:
    try:
      self.run.log(values, step=step)
    except Exception as e:  # a tracker never stops the run; one warning says why
      if not self.failed:
        log.warning("W&B logging failed (the run goes on; metrics.jsonl has every line): %s",
                    e)
      self.failed = True

  def close(self) -> None:
    self.run.finish()
