"""AR SFT of the tiny model on arith_sft: stage 1 of the MARS recipe (and the AR baseline)."""

from cardjax.config import load_config


def get_config():
  c = load_config("tiny_ar")
  c.name = "tiny_sft"
  c.objective.name = "ar"
  c.data.dataset = "arith_sft"
  c.data.mode = "sft"
  c.data.eval_split = "test"
  c.data.pad_to_multiple = 4  # responses padded to whole MARS blocks in both stages
  return c
