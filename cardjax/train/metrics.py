"""Metrics to a JSONL file (one object per logged step, easy to plot) and TensorBoard
event files; only process 0 writes.

For a bucket workdir both are written to a local staging folder and uploaded at each
checkpoint and at the end (`sync`): GCS objects cannot be appended to and are only visible
once closed, and tensorboardX writes local files. The bucket's metrics.jsonl is read back
first, so a resumed run (on any machine) continues it; a run killed between syncs loses the
lines since the last checkpoint, which the resumed run logs again.
"""

from __future__ import annotations

import json
import logging
import math
import shutil
from pathlib import Path

import jax

from cardjax.storage import checked_path, is_remote, resolve, trees
from cardjax.storage.cache import staging_dir


def local_run_dir(workdir: str | Path) -> Path:
  """Where a run's metrics, TensorBoard and profile files are written: the workdir, or for
  a bucket workdir its local staging folder (uploaded by MetricsWriter.sync)."""
  workdir = resolve(workdir)
  return staging_dir(workdir) / "run" if is_remote(workdir) else Path(workdir)


class MetricsWriter:
  def __init__(self, workdir: str | Path):
    self.enabled = jax.process_index() == 0
    self.workdir = resolve(workdir)
    self.remote = is_remote(self.workdir)
    self.local = local_run_dir(self.workdir)
    self.jsonl = None
    self.tb = None
    if self.enabled:
      workdir = self.local
      if self.remote:  # start from the bucket's copy, not from an older local one
        shutil.rmtree(workdir, ignore_errors=True)
        workdir.mkdir(parents=True)
        saved = checked_path(self.workdir) / "metrics.jsonl"
        (workdir / "metrics.jsonl").write_bytes(saved.read_bytes() if saved.exists() else b"")
      workdir.mkdir(parents=True, exist_ok=True)
      self.jsonl = open(workdir / "metrics.jsonl", "a", buffering=1)
      try:
        from tensorboardX import SummaryWriter
        self.tb = SummaryWriter(str(workdir / "tensorboard"))
      except ImportError:  # TensorBoard files are optional; the JSONL file is not
        logging.getLogger("cardjax.train").warning(
            "tensorboardX is not installed: no TensorBoard files, metrics.jsonl only")
        self.tb = None

  def write(self, step: int, values: dict, prefix: str = "train") -> None:
    if not self.enabled:
      return
    clean = {f"{prefix}/{k}": float(v) for k, v in values.items()
             if v is not None and math.isfinite(float(v))}
    self.jsonl.write(json.dumps({"step": step, **clean}) + "\n")
    if self.tb is not None:
      for key, value in clean.items():
        self.tb.add_scalar(key, value, step)

  def sync(self) -> None:
    """Upload the local files to a bucket workdir (each whole: objects are not appended)."""
    if not (self.enabled and self.remote):
      return
    self.jsonl.flush()
    if self.tb is not None:
      self.tb.flush()
    trees.upload(self.local, self.workdir)

  def close(self) -> None:
    if self.jsonl is not None:
      self.jsonl.close()
    if self.tb is not None:
      self.tb.close()
    if self.enabled and self.remote:
      trees.upload(self.local, self.workdir)
