"""LoRA adapters in Hugging Face PEFT's format: `export-hf --lora peft` writes a folder that
`peft.PeftModel.from_pretrained` loads to cardjax's logits, `train.lora.init_from` continues
training it, and an adapter that does not fit the config or the base is one clear error."""

import json

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from cardjax import checkpoint
from cardjax.cli import main
from cardjax.config import load_config, model_config
from cardjax.data.prepare import prepare
from cardjax.errors import CheckpointError, ConfigError
from cardjax.hf import peft as cj_peft
from cardjax.model import ModelConfig, adapters, create_model
from cardjax.model.lora_spec import LoraSpec
from cardjax.parallel import make_mesh
from cardjax.train import loop, train
from conftest import max_abs_diff, random_tokens, torch_logits

pytest.importorskip("peft")

SMALL = ["--config.model.hidden_size=32", "--config.model.intermediate_size=64",
         "--config.data.batch_size=8", "--config.data.seq_len=64",
         "--config.data.options.train_size=240", "--config.data.options.test_size=8",
         "--config.train.progress=false", "--config.train.eval_every=0",
         "--config.train.eval_steps=1", "--config.train.log_every=1",
         "--config.train.lr=1e-2", "--config.train.warmup_steps=0"]
# Rank 4, scale alpha / r = 2, on projections of both layouts (q, v: [in, *out]; o, down:
# [*in, out]).
LORA = ["--config.train.lora.rank=4", "--config.train.lora.alpha=8",
        "--config.train.lora.targets=q,v,o,down"]


def _config(root, *extra):
  return load_config("configs/tiny_sft.py", [f"--config.data.data_dir={root / 'data'}",
                                             *SMALL, *extra])


@pytest.fixture(scope="module")
def run(tmp_path_factory):
  """A random-init fp32 base (a cardjax checkpoint) and 3 LoRA steps over it: the root."""
  root = tmp_path_factory.mktemp("peft")
  base = root / "base"
  config = _config(root, f"--config.train.init_from={base}", *LORA, "--config.train.steps=3",
                   "--config.train.checkpoint_every=3")
  prepare(config)
  checkpoint.save_model(base, create_model(model_config(config), seed=1))
  train(config, root / "run")
  return root


def test_export_loads_in_peft(run, tmp_path):
  """The adapter folder is PEFT's (names, shapes, config); transformers + PeftModel on the
  exported base give cardjax's merged logits within 1e-4. The base, a cardjax checkpoint,
  is written beside the adapter; a HF-folder base (--lora-base) is only named."""
  import torch
  from peft import PeftModel
  from transformers import AutoModelForCausalLM

  ckpt, out = run / "run" / "checkpoints", tmp_path / "adapter"
  assert main(["export-hf", str(ckpt), str(out), "--lora", "peft"]) == 0
  config = json.loads((out / "adapter_config.json").read_text())
  assert (config["peft_type"], config["task_type"], config["bias"]) == ("LORA", "CAUSAL_LM",
                                                                        "none")
  assert (config["r"], config["lora_alpha"]) == (4, 8)
  assert config["target_modules"] == ["q_proj", "v_proj", "o_proj", "down_proj"]
  assert config["base_model_name_or_path"] == str(out / "base")
  from safetensors.numpy import load_file
  tensors = load_file(str(out / "adapter_model.safetensors"))
  assert len(tensors) == 2 * 2 * 4  # layers x projections x (A, B)
  a = tensors["base_model.model.model.layers.1.mlp.down_proj.lora_A.weight"]
  b = tensors["base_model.model.model.layers.0.self_attn.q_proj.lora_B.weight"]
  assert a.shape == (4, 64) and b.shape == (32, 4) and np.abs(b).max() > 0  # B trained

  merged, _ = checkpoint.restore_model(ckpt)
  base_model, _ = checkpoint.load_model(run / "base")
  tokens = random_tokens(merged.cfg.vocab_size, 2, 24)
  want = np.asarray(merged(jnp.asarray(tokens)))
  assert max_abs_diff(base_model(jnp.asarray(tokens)), want) > 1e-3  # adapters do something
  theirs = AutoModelForCausalLM.from_pretrained(str(out / "base"), dtype=torch.float32)
  theirs = PeftModel.from_pretrained(theirs, str(out)).eval()
  assert max_abs_diff(torch_logits(theirs, tokens), want) < 1e-4
  # What peft itself writes reads back into cardjax as the run's adapters.
  theirs.save_pretrained(str(tmp_path / "resaved"))
  back = cj_peft.read_adapter(tmp_path / "resaved", merged.cfg,
                              LoraSpec(4, 8.0, ("q", "v", "o", "down")))
  saved = checkpoint.checkpoint_adapters(ckpt)
  jax.tree.map(np.testing.assert_array_equal, back, jax.tree.map(np.asarray, saved))

  again = tmp_path / "named"
  assert main(["export-hf", str(ckpt), str(again), "--lora", "peft",
               "--lora-base", str(out / "base")]) == 0
  assert not (again / "base").exists()
  config = json.loads((again / "adapter_config.json").read_text())
  assert config["base_model_name_or_path"] == str(out / "base")
  assert (again / "adapter_model.safetensors").read_bytes() == \
      (out / "adapter_model.safetensors").read_bytes()


def _exported(run):
  """(adapter folder, HF base folder) of the run, exported once per module."""
  out = run / "exported"
  if not (out / "adapter_config.json").is_file():
    assert main(["export-hf", str(run / "run" / "checkpoints"), str(out), "--lora", "peft"]) == 0
  return out, out / "base"


def _setup(run, tmp_path, *extra):
  out, base = _exported(run)
  config = _config(run, f"--config.train.init_from={base}", *LORA,
                   f"--config.train.lora.init_from={out}", "--config.train.steps=2",
                   "--config.train.checkpoint_every=0", *extra)
  mesh = make_mesh(1, 1, 1, devices=jax.devices()[:1])
  with jax.set_mesh(mesh):
    return loop.setup(config, tmp_path / "again", mesh), mesh


def test_continue_training_from_peft(run, tmp_path):
  """train.lora.init_from starts the adapters at the PEFT folder's values (the run's, bit
  for bit), then two steps train them with a finite loss while the base stays frozen."""
  job, mesh = _setup(run, tmp_path)
  start = jax.tree.map(np.asarray, job.params)
  saved = checkpoint.checkpoint_adapters(run / "run" / "checkpoints")
  jax.tree.map(np.testing.assert_array_equal, start, jax.tree.map(np.asarray, saved))
  frozen = jax.tree.map(np.asarray, job.frozen)
  with jax.set_mesh(mesh):
    for step in (1, 2):
      job.advance(step)
      assert np.isfinite(float(job.metrics["loss"]))
    job.close()
  assert max(max_abs_diff(a, b) for a, b in zip(jax.tree.leaves(start),
                                                jax.tree.leaves(job.params))) > 0
  jax.tree.map(np.testing.assert_array_equal, frozen, jax.tree.map(np.asarray, job.frozen))


@pytest.mark.parametrize("flag,message", [
    ("--config.train.lora.rank=8", r"rank 4, alpha 8, targets q,v,o,down .* is rank 8"),
    ("--config.train.lora.targets=q,v", r"targets q,v,o,down .* targets q,v;"),
])
def test_a_mismatched_adapter_is_one_clear_error(run, tmp_path, flag, message):
  """Rank or targets other than the adapter's: one ConfigError naming both and the flags."""
  with pytest.raises(ConfigError, match=message) as error:
    _setup(run, tmp_path, flag)
  assert ("--config.train.lora.rank=4 --config.train.lora.alpha=8 "
          "--config.train.lora.targets=q,v,o,down") in str(error.value)


def test_scan_layers_and_a_foreign_base(tmp_path, capsys):
  """A list model's adapters read back into a scanned model stacked; an adapter of another
  base's sizes, and a folder that is no adapter, are one clear error each."""
  cfg, spec = ModelConfig(), LoraSpec(4, 0.0, ("k", "gate", "up", "down"))
  model = adapters.attach(create_model(cfg, seed=0), spec)
  _, values, _ = adapters.split(model)
  values = jax.tree.map(lambda x: np.asarray(x) + 0.01, values)
  cj_peft.write_adapter(tmp_path / "a", values, cfg, spec, base=None)
  assert json.loads((tmp_path / "a" / "adapter_config.json").read_text())["lora_alpha"] == 4
  scanned = ModelConfig(scan_layers=True)
  back = cj_peft.read_adapter(tmp_path / "a", scanned, spec)
  for layer in range(cfg.num_layers):
    np.testing.assert_array_equal(back["layers"]["mlp"]["up_lora"]["lora"]["lora_b"][layer],
                                  values["layers"][layer]["mlp"]["up_lora"]["lora"]["lora_b"])
  with pytest.raises(CheckpointError, match=r"needs \[4, 96\] .*the base model the adapter"):
    cj_peft.read_adapter(tmp_path / "a", ModelConfig(hidden_size=96), spec)
  with pytest.raises(CheckpointError, match="not a PEFT adapter folder"):
    cj_peft.read_adapter(tmp_path, cfg, spec)
  assert main(["export-hf", str(tmp_path), str(tmp_path / "x"), "--base-out",
               str(tmp_path)]) == 2
  assert "--base-out writes the base of a PEFT adapter: add --lora peft" in \
      capsys.readouterr().err
