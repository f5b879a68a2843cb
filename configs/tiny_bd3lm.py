"""BD3LM pretraining of the tiny model (configs/tiny_ar.py's recipe) on python_stdlib."""

from cardjax.config import load_config


def get_config():
  c = load_config("tiny_ar")
  c.name = "tiny_bd3lm"
  c.objective.name = "bd3lm"
  c.objective.block_size = 4
  return c
