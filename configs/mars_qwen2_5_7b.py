"""MARS on Qwen2.5-7B-Instruct: the recipe of configs/mars_qwen2_5_0_5b.py on the 7B model
(`:sft` then `:mars`), with FSDP over all devices and 4-way tensor parallelism."""

import importlib.util
from pathlib import Path

_spec = importlib.util.spec_from_file_location(
    "mars_recipe", Path(__file__).with_name("mars_qwen2_5_0_5b.py"))
_recipe = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(_recipe)


def get_config(stage: str = "mars"):
  c = _recipe.recipe("qwen2_5_7b", stage)
  c.mesh.tensor = 4
  return c
