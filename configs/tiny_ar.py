"""AR pretraining of the tiny model (configs/tiny.py) on python_stdlib; seconds on CPU."""

from cardjax.config import load_config


def get_config():
  c = load_config("tiny")
  c.name = "tiny_ar"
  c.objective.name = "ar"
  c.train.steps = 200
  c.train.lr = 3e-3
  c.train.warmup_steps = 20
  c.train.eval_every = 100
  c.train.checkpoint_every = 100
  return c
