"""MARS on Qwen2.5-7B-Instruct: the recipe of configs/mars_qwen2_5_0_5b.py on the 7B model
(`:sft` then `:mars`), with FSDP over all devices and 4-way tensor parallelism.

Where it runs (`cardjax plan` of the :mars stage, per device, docs/scale.md):
  v5p-64 (32 chips)  as shipped, grad_accum 1: 71.1 of 95 GiB; 2.9 s a step at 40% MFU
  8xH200             --config.train.grad_accum=2: 129.0 of 140 GiB (XLA:GPU's plan; take
                     grad_accum 4 or train.loss_chunk for headroom); 5.3 s a step
"""

import importlib.util
from pathlib import Path

_spec = importlib.util.spec_from_file_location(
    "mars_recipe", Path(__file__).with_name("mars_qwen2_5_0_5b.py"))
_recipe = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(_recipe)


def get_config(stage: str = "mars"):
  c = _recipe.recipe("qwen2_5_7b", stage)
  c.mesh.tensor = 4
  c.train.grad_accum = 1  # v5p-64 as planned; 2 on 8xH200 (see above)
  c.train.loss_chunk = 0
  return c
