"""The `cardjax` command end to end: init -> export-hf -> import-hf -> export-hf."""

import json
import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
from safetensors.numpy import load_file

from cardjax import checkpoint
from cardjax.cli import main

TINY = ["--config", "configs/tiny.py", "--config.model.num_layers=1",
        "--config.model.hidden_size=32", "--config.model.intermediate_size=64"]


def _tensors(folder):
  return load_file(str(Path(folder) / "model.safetensors"))


def test_init_export_import_export_is_bit_exact(tmp_path, capsys):
  assert main(["init", *TINY, "--workdir", str(tmp_path / "run")]) == 0
  ckpt = tmp_path / "run" / "checkpoints"
  assert checkpoint.latest_step(ckpt) == 0
  assert checkpoint.read_run_config(ckpt).model.hidden_size == 32  # its tokenizer's source
  assert main(["export-hf", str(ckpt), str(tmp_path / "hf1")]) == 0
  # Tokenizer files travel with an import and come back out with the export.
  (tmp_path / "hf1" / "tokenizer_config.json").write_text(json.dumps({"model_max_length": 64}))
  assert main(["import-hf", str(tmp_path / "hf1"), str(tmp_path / "ck2"), "--step", "7"]) == 0
  assert main(["export-hf", str(tmp_path / "ck2"), str(tmp_path / "hf2")]) == 0
  a, b = _tensors(tmp_path / "hf1"), _tensors(tmp_path / "hf2")
  assert sorted(a) == sorted(b) and len(a) > 5
  for key in a:
    np.testing.assert_array_equal(a[key], b[key])
  assert (tmp_path / "hf2" / "tokenizer_config.json").read_text() == json.dumps(
      {"model_max_length": 64})
  config = json.loads((tmp_path / "hf2" / "config.json").read_text())
  assert config["num_hidden_layers"] == 1 and config["hidden_size"] == 32
  assert "step 7" in capsys.readouterr().out


def test_scan_layers_import_and_bf16_export(tmp_path):
  assert main(["init", *TINY, "--workdir", str(tmp_path / "run")]) == 0
  assert main(["export-hf", str(tmp_path / "run" / "checkpoints"), str(tmp_path / "hf")]) == 0
  assert main(["import-hf", str(tmp_path / "hf"), str(tmp_path / "ck"), "--scan-layers"]) == 0
  model, _ = checkpoint.restore_model(tmp_path / "ck")
  assert model.cfg.scan_layers
  assert main(["export-hf", str(tmp_path / "ck"), str(tmp_path / "bf"), "--dtype",
               "bfloat16"]) == 0
  fp32, bf16 = _tensors(tmp_path / "hf"), _tensors(tmp_path / "bf")
  key = "model.layers.0.self_attn.q_proj.weight"
  assert str(bf16[key].dtype) == "bfloat16"
  np.testing.assert_allclose(bf16[key].astype(np.float32), fp32[key], rtol=1e-2, atol=1e-3)
  assert json.loads((tmp_path / "bf" / "config.json").read_text())["torch_dtype"] == "bfloat16"


def test_config_command_prints_overrides(capsys):
  assert main(["config", *TINY]) == 0
  out = capsys.readouterr().out
  assert "num_layers: 1" in out and "hidden_size: 32" in out


@pytest.mark.parametrize("argv,needle", [
    (["config", "--config", "configs/tiny.py", "--config.model.num_layer=1"],
     "did you mean 'model.num_layers'"),
    (["export-hf", "/nonexistent/ckpt", "/tmp/out"], "does not exist"),
    (["import-hf", "/nonexistent/hf", "/tmp/out"], "is not a directory"),
])
def test_user_errors_exit_2_with_one_line(argv, needle, capsys):
  assert main(argv) == 2
  err = capsys.readouterr().err.strip().splitlines()
  assert len(err) == 1 and err[0].startswith("cardjax: error:") and needle in err[0]


def test_console_script_is_installed(tmp_path):
  exe = Path(sys.executable).with_name("cardjax")
  result = subprocess.run([str(exe), "config", *TINY], capture_output=True, text=True,
                          env={**os.environ, "JAX_PLATFORMS": "cpu"}, timeout=300)
  assert result.returncode == 0, result.stderr
  assert "num_layers: 1" in result.stdout


def test_train_builds_a_missing_embedded_dataset(tmp_path, capsys):
  """`cardjax train` on a data_dir where the dataset is not built builds it (and its
  tokenizer) first, as tfds.load does, instead of stopping with the build command."""
  data = tmp_path / "data"
  argv = ["train", "--config", "configs/tiny_sft.py", "--workdir", str(tmp_path / "run"),
          f"--config.data.data_dir={data}", "--config.data.options.train_size=64",
          "--config.data.options.test_size=8", "--config.data.tokenizer_vocab=300",
          "--config.model.num_layers=1", "--config.model.hidden_size=32",
          "--config.model.intermediate_size=64", "--config.data.batch_size=8",
          "--config.train.steps=2", "--config.train.eval_every=0",
          "--config.train.checkpoint_every=2", "--config.train.progress=false"]
  assert main(argv) == 0
  assert "trained 2 steps" in capsys.readouterr().out
  assert list(data.rglob("tokenizer.json")) and list(data.rglob("dataset_info.json"))
  # A batch that the 8 test devices cannot split: one line naming the fix, exit 2.
  odd = [a if not a.startswith("--config.data.batch_size") else "--config.data.batch_size=4"
         for a in argv]
  odd[odd.index("--workdir") + 1] = str(tmp_path / "odd")
  assert main(odd) == 2
  assert "batch_size=4 does not split over the 8 devices" in capsys.readouterr().err


def _helps():
  """(command, its --help text) for every command of the table, data build/show included."""
  from cardjax.cli import COMMANDS, build_parser
  from cardjax.cli_flags import parser_tree

  for command in COMMANDS:
    parser = build_parser([command.name])
    sub = next(a for a in parser._actions if a.dest == "command").choices[command.name]
    for p in parser_tree(sub):
      yield p.prog, p.format_help()


def test_every_help_lists_dashed_flags_and_the_underscore_note():
  import re

  helps = dict(_helps())
  assert {"cardjax data build", "cardjax data show", "cardjax serve"} <= set(helps)
  for prog, text in helps.items():
    text = " ".join(text.split())
    note = re.search(r"\((--\w+)\) are accepted until the next release", text)
    flags = set(re.findall(r"(?<![\w.])--[a-z][\w-]*", text))
    underscored = {f for f in flags if "_" in f}  # only the note's example
    assert underscored == ({note.group(1)} if note else set()), prog
    assert bool(note) == any("-" in f[2:] for f in flags - underscored), prog


def test_underscore_spellings_are_rewritten_and_only_flags():
  from cardjax.cli_flags import dashed, free_options

  flags = {"--data-dir", "--max-new-tokens", "--config"}
  argv = ["--data_dir", "d", "--max_new_tokens=8", "--config.model.num_layers=2",
          "--train_size", "5", "--", "--data_dir"]
  assert dashed(argv, flags) == ["--data-dir", "d", "--max-new-tokens=8",
                                 "--config.model.num_layers=2", "--train_size", "5", "--",
                                 "--data_dir"]
  assert free_options(["--train-size", "5", "--test_size=2", "--flag"]) == (
      {"train_size": "5", "test_size": "2"}, ["--flag"])


def test_overrides_are_refused_by_a_command_that_takes_none(capsys):
  assert main(["export-hf", "/nonexistent/ckpt", "/tmp/out", "--config.model.dtype=x"]) == 2
  assert "export-hf takes no --config overrides" in capsys.readouterr().err
