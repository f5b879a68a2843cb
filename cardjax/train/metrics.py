"""Metrics to a JSONL file (one object per logged step, easy to plot) and TensorBoard
event files; only process 0 writes."""

from __future__ import annotations

import json
import logging
import math
from pathlib import Path

import jax


class MetricsWriter:
  def __init__(self, workdir: Path):
    self.enabled = jax.process_index() == 0
    self.jsonl = None
    self.tb = None
    if self.enabled:
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

  def close(self) -> None:
    if self.jsonl is not None:
      self.jsonl.close()
    if self.tb is not None:
      self.tb.close()
