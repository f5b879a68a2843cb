"""Every tiny training config runs end to end and its loss falls."""

import json

import pytest

from cardjax.config import load_config
from cardjax.data.prepare import prepare
from cardjax.train import train

# `make test-integration`: 15-25 s a config on 2 cores: six trainings end to end.
pytestmark = pytest.mark.integration

FAST = ["--config.data.seq_len=64", "--config.data.batch_size=8", "--config.train.steps=24",
        "--config.train.log_every=4", "--config.train.eval_every=0",
        "--config.train.eval_steps=1", "--config.train.progress=false",
        "--config.train.warmup_steps=4", "--config.train.lr=5e-3"]
PRETRAIN = ["--config.data.options.max_files=40", "--config.data.options.validation_percent=10"]
SFT = ["--config.data.options.train_size=400", "--config.data.options.test_size=20"]
CONFIGS = {"tiny_ar": PRETRAIN, "tiny_card": PRETRAIN, "tiny_mdlm": PRETRAIN,
           "tiny_bd3lm": PRETRAIN, "tiny_sft": SFT, "tiny_mars": SFT}


@pytest.fixture(scope="module")
def data_dir(tmp_path_factory):
  root = tmp_path_factory.mktemp("data")
  for name in ("tiny_ar", "tiny_sft"):
    prepare(load_config(f"configs/{name}.py", [f"--config.data.data_dir={root}",
                                               *CONFIGS[name], *FAST]))
  return root


@pytest.mark.parametrize("name", sorted(CONFIGS))
def test_tiny_config_loss_falls(name, data_dir, tmp_path):
  config = load_config(f"configs/{name}.py", [f"--config.data.data_dir={data_dir}",
                                              *CONFIGS[name], *FAST])
  result = train(config, tmp_path)
  lines = [json.loads(l) for l in open(tmp_path / "metrics.jsonl")]
  losses = [l["train/loss"] for l in lines if "train/loss" in l]
  assert len(losses) == 6
  assert losses[-1] < losses[0] - 0.3, losses
  assert result["eval"]["ar_nll"] > 0
  assert f"train/loss/{config.objective.name}" in lines[0]
