"""The trainer: optimizer, the jitted step, checkpoints, metrics and the loop."""

from cardjax.train.loop import train
from cardjax.train.periodic import Preempted, TrainingError

__all__ = ["train", "TrainingError", "Preempted"]
