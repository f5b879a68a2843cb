"""Metrics to a JSONL file (one object per logged step, easy to plot) and TensorBoard
event files, and to the experiment trackers of train.trackers (cardjax/train/trackers.py);
only process 0 writes.

For a bucket workdir both are written to a local staging folder, beside goodput.json and
profile/, and uploaded while the run goes (cardjax/train/metrics_sync.py): in the
background, every train.metrics_sync_seconds at metrics lines, at each checkpoint and at
the end. GCS objects cannot be appended to and are only visible once closed, and
tensorboardX writes local files. The bucket's metrics.jsonl (and the run's small state
files, RESTORED) is read back first, so a resumed run (on any machine) continues it; a run
killed between uploads loses the lines since the last one, which the resumed run logs
again if they are past its checkpoint.
"""

from __future__ import annotations

import json
import logging
import math
import shutil
import time
from pathlib import Path

import jax

from cardjax.storage import checked_path, is_remote, resolve
from cardjax.storage.cache import staging_dir
from cardjax.train.metrics_sync import BucketSync

# Small files of a run that a resumed run continues: read back from a bucket workdir.
RESTORED = ("metrics.jsonl", "goodput.json", "wandb.json")


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
        for name in RESTORED:
          saved = checked_path(self.workdir) / name
          if saved.exists():
            (workdir / name).write_bytes(saved.read_bytes())
      workdir.mkdir(parents=True, exist_ok=True)
      self.jsonl = open(workdir / "metrics.jsonl", "a", buffering=1)
      try:
        from tensorboardX import SummaryWriter
        self.tb = SummaryWriter(str(workdir / "tensorboard"))
      except ImportError:  # TensorBoard files are optional; the JSONL file is not
        logging.getLogger("cardjax.train").warning(
            "tensorboardX is not installed: no TensorBoard files, metrics.jsonl only")
        self.tb = None
    self.trackers = []  # cardjax/train/trackers.py: each gets every line (process 0)
    self.closing = []  # called at close before the last upload (goodput's last figures)
    # A bucket workdir's uploads (cardjax/train/metrics_sync.py); W&B's local files are its
    # own business, not the bucket's.
    self.bucket = (BucketSync(self.local, self.workdir, skip=("wandb",))
                   if self.enabled and self.remote else None)
    self.sync_every = None  # seconds between uploads at metrics lines; None: only sync()
    self.synced = -math.inf  # when the last upload was asked for (the first line asks)

  def write(self, step: int, values: dict, prefix: str = "train") -> None:
    if not self.enabled:
      return
    clean = {f"{prefix}/{k}": float(v) for k, v in values.items()
             if v is not None and math.isfinite(float(v))}
    self.jsonl.write(json.dumps({"step": step, **clean}) + "\n")
    if self.tb is not None:
      for key, value in clean.items():
        self.tb.add_scalar(key, value, step)
    for tracker in self.trackers:
      tracker.log(step, clean)
    if (prefix == "train" and self.sync_every is not None
        and time.monotonic() - self.synced >= self.sync_every):
      self.sync()

  def sync(self) -> None:
    """Upload the local files to a bucket workdir, in the background (each file whole as
    far as it is written now: objects are not appended)."""
    if self.bucket is None:
      return
    self.jsonl.flush()
    if self.tb is not None:
      self.tb.flush()
    self.synced = time.monotonic()
    self.bucket.request()

  def close(self) -> None:
    for finish in self.closing:
      finish()
    for tracker in self.trackers:
      tracker.close()
    if self.jsonl is not None:
      self.jsonl.close()
    if self.tb is not None:
      self.tb.close()
    if self.bucket is not None:  # the last upload, waited for; a failure is a warning
      self.bucket.close()
