"""MARS fine-tuning of the tiny model on arith_sft (stage 2 of the recipe).

Set --config.train.init_from=RUN/checkpoints (a tiny_sft run) to follow the paper's
two-stage recipe; left empty it starts from a random init.
"""

from cardjax.config import load_config


def get_config():
  c = load_config("tiny_sft")
  c.name = "tiny_mars"
  c.objective.name = "mars"
  c.objective.block_size = 4
  c.objective.alpha = 1.0
  return c
