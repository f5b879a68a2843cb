"""From a config to batches: tfds build + trained tokenizer + loader; CLI; checkpointed state."""

import numpy as np
import pytest

from cardjax import checkpoint
from cardjax.cli import main
from cardjax.config import load_config
from cardjax.data.prepare import load_data_tokenizer, make_loader, prepare, tokenizer_dir
from cardjax.errors import CardjaxError, ConfigError
from cardjax.model import ModelConfig, create_model


def _config(tmp_path, *overrides):
  return load_config("configs/tiny.py", [f"--config.data.data_dir={tmp_path}", *overrides])


ARITH = ("--config.data.dataset=arith_sft", "--config.data.mode=sft",
         "--config.data.options.train_size=300", "--config.data.options.test_size=20",
         "--config.data.pad_to_multiple=4", "--config.data.packing=false")


@pytest.fixture(scope="module")
def arith_dir(tmp_path_factory):
  root = tmp_path_factory.mktemp("data")
  prepare(_config(root, *ARITH))
  return root


def test_arith_sft_from_config(arith_dir):
  config = _config(arith_dir, *ARITH)
  tok = load_data_tokenizer(config)
  assert tok.mask_id == config.model.mask_token_id == 3 and tok.vocab_size <= 512
  batch = next(make_loader(config))
  assert batch["tokens"].shape == (8, 128)
  assert batch["loss_mask"].sum() > 0 and (batch["loss_mask"] <= (batch["segment_ids"] > 0)).all()
  test = next(make_loader(config, split="test", num_epochs=1, shuffle=False))
  text = tok.decode(test["tokens"][0][test["loss_mask"][0] == 1])
  assert "The answer is" in text


def test_python_stdlib_pretrain_rows(tmp_path):
  config = _config(tmp_path, "--config.data.options.max_files=40", "--config.data.seq_len=64",
                   "--config.data.options.validation_percent=10")
  prepare(config)
  assert (tokenizer_dir(config) / "tokenizer.json").is_file()
  batch = next(make_loader(config))
  assert batch["tokens"].shape == (8, 64)
  assert (batch["segment_ids"] > 0).mean() > 0.9  # packed rows are nearly full
  val = make_loader(config, split="validation", num_epochs=1)
  assert next(val)["tokens"].shape == (8, 64)


def test_resume_from_an_orbax_checkpoint(arith_dir, tmp_path):
  config = _config(arith_dir, *ARITH)
  expected = make_loader(config)
  want = [next(expected) for _ in range(4)]
  loader = make_loader(config)
  for _ in range(2):
    next(loader)
  model = create_model(ModelConfig(vocab_size=512, hidden_size=32, intermediate_size=64,
                                   num_layers=1))
  checkpoint.save_model(tmp_path / "ck", model, step=2, data_loader=loader)
  resumed = make_loader(config)
  checkpoint.restore_data_state(tmp_path / "ck", resumed)
  assert (tmp_path / "ck" / "2" / "data" / "shard_0-of-1.json").is_file()
  for batch in want[2:]:
    got = next(resumed)
    for key in batch:
      np.testing.assert_array_equal(got[key], batch[key])


def test_clear_errors(tmp_path, arith_dir):
  with pytest.raises(CardjaxError, match="is not built in .*cardjax data build arith_sft"):
    make_loader(_config(tmp_path / "missing", *ARITH))
  with pytest.raises(CardjaxError, match="set model.mask_token_id=3"):
    load_data_tokenizer(_config(arith_dir, *ARITH, "--config.model.mask_token_id=7"))
  with pytest.raises(CardjaxError, match="raise model.vocab_size"):
    built = tokenizer_dir(_config(arith_dir, *ARITH))
    load_data_tokenizer(_config(arith_dir, *ARITH, "--config.model.vocab_size=300",
                                f"--config.data.tokenizer={built}"))
  with pytest.raises(CardjaxError, match="holds conversations"):
    make_loader(_config(arith_dir, *ARITH, "--config.data.mode=pretrain"))
  with pytest.raises(ConfigError, match="must divide data.seq_len=128"):
    _config(arith_dir, *ARITH, "--config.data.pad_to_multiple=5")
  with pytest.raises(CardjaxError, match="no split 'validation'"):
    make_loader(_config(arith_dir, *ARITH), split="validation")


def test_cli_data_build_and_show(tmp_path, capsys):
  args = ["--data-dir", str(tmp_path), "--train-size", "50", "--test-size", "5"]
  assert main(["data", "build", "arith_sft", *args]) == 0
  assert "{'train': 50, 'test': 5}" in capsys.readouterr().out
  # The underscore spellings of before the flags were dashed, accepted for one release.
  old = [f"--data_dir={tmp_path}", "--train_size", "50", "--test_size", "5"]
  assert main(["data", "show", "arith_sft", *old, "--n", "2", "--split", "test"]) == 0
  out = capsys.readouterr().out
  assert out.count("-- row") == 2 and "\u27e6" in out and "The answer is" in out
  assert main(["data", "build", "arith_sft", *args, "--bogus", "1"]) == 2
  assert "no option bogus" in capsys.readouterr().err
