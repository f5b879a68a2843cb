"""The trainer: optimizer, the jitted step, checkpoints, metrics and the loop."""

from cardjax.train.loop import Preempted, TrainingError, train

__all__ = ["train", "TrainingError", "Preempted"]
