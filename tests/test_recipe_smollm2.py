"""configs/smollm2_135m.py: the stages load and validate, and the MARS stage starts from
the SFT stage (the paper's two-stage recipe). The model section is checked against the
real file in tests/test_gguf_real.py (slow)."""

import pytest

from cardjax.config import load_config
from cardjax.errors import ConfigError


def test_stages():
  sft = load_config("configs/smollm2_135m.py:sft")
  mars = load_config("configs/smollm2_135m.py:mars")
  assert (sft.objective.name, mars.objective.name) == ("ar", "mars")
  assert mars.train.init_from == "runs/smollm2/sft/checkpoints"
  assert sft.train.init_from == "runs/smollm2/base"
  assert sft.data.tokenizer == mars.data.tokenizer == "runs/smollm2/base/hf_assets"
  assert sft.model == mars.model and sft.model.mask_token_id == 16
  assert sft.data.pad_to_multiple % mars.objective.block_size == 0
  lora = load_config("configs/smollm2_135m.py:mars_lora")
  assert lora.objective == mars.objective and lora.data == mars.data
  assert lora.train.init_from == mars.train.init_from and lora.train.steps == mars.train.steps
  assert (lora.train.lora.rank, mars.train.lora.rank) == (16, 0)


def test_unknown_stage_is_an_error():
  with pytest.raises((ValueError, ConfigError), match="pick a stage"):
    load_config("configs/smollm2_135m.py:dpo")
