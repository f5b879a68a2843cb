"""MDLM pretraining of the tiny model (configs/tiny_ar.py's recipe) on python_stdlib."""

from cardjax.config import load_config


def get_config():
  c = load_config("tiny_ar")
  c.name = "tiny_mdlm"
  c.objective.name = "mdlm"
  return c
