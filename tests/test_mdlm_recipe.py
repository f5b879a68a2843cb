"""configs/decode_bench.py:mdlm_recipe reads context where the earlier MDLM recipe did not.

The tiny model (64 wide, 2 layers) on 40 stdlib files, 1200 steps of 32 rows of 64 tokens,
once with the earlier settings (unshifted outputs, independent t) and once with
mdlm_recipe's; each probed by benchmarks/studies/mdlm_context.py (masked CE when every
token is masked with probability t). A model that reads context predicts a masked token
better with 95% of the row in view (t = 0.05) than with none (t = 1). At 600 steps the
recipe's gap was 0.24 nats in one process and 0.12 on the tests' 8 simulated devices (the
earlier recipe's: 0.01), too close to call; at 1200 steps it is wider (see the asserts).
Slow (two training runs, minutes): `make test-slow` runs it.
"""

from __future__ import annotations

import pytest

from benchmarks.studies import mdlm_context as ctx
from cardjax.config import config_module, load_config
from cardjax.data.prepare import prepare
from cardjax.eval import nll
from cardjax.restore import load_run
from cardjax.train import train
from launch_helpers import ROOT


def _masked_ce(data_dir, run, recipe: bool):
  config = load_config("configs/tiny_mdlm.py", [
      f"--config.data.data_dir={data_dir}", "--config.data.options.max_files=40",
      "--config.data.options.validation_percent=10", "--config.data.seq_len=64",
      "--config.data.batch_size=32", "--config.train.steps=1200",
      "--config.train.eval_every=0", "--config.train.checkpoint_every=1200",
      "--config.train.log_every=100", "--config.train.progress=false"])
  if recipe:
    config_module(ROOT / "configs/decode_bench.py").mdlm_recipe(config)
  assert config.data.batch_size == 32  # the recipe's rows: both runs see the same tokens
  prepare(config)
  train(config, run)
  loaded = load_run(run)
  data = nll.data_config(loaded)
  batches = nll.validation_batches(data, nll.default_split(data), 4)
  return ctx.masked_ce_by_rate(loaded, batches, (0.05, 1.0))


@pytest.mark.slow
def test_the_recipe_reads_context_and_the_earlier_one_did_not(tmp_path):
  before = _masked_ce(tmp_path / "data", tmp_path / "earlier", recipe=False)
  after = _masked_ce(tmp_path / "data", tmp_path / "recipe", recipe=True)
  assert abs(before[1.0] - before[0.05]) < 0.05, before  # flat: context unread
  assert after[1.0] - after[0.05] > 0.2, after  # 95% of the row in view helps
  assert after[0.05] < before[0.05] - 0.15, (before, after)


@pytest.mark.parametrize("name", ["mdlm"])
def test_decode_bench_mdlm_is_the_recipe(name):
  config = load_config(f"configs/decode_bench.py:{name}")
  assert config.objective.shift and config.objective.t_draw == "stratified"
  assert config.data.batch_size == 32 and config.model.hidden_size == 128


def test_a2d_starts_from_an_ar_run_unless_told_otherwise():
  config = load_config("configs/decode_bench.py:mdlm_a2d")
  assert config.train.init_from.endswith("runs/ar/checkpoints")
  assert config.objective.shift and config.train.lr == 1e-3
