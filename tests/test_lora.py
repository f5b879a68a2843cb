"""LoRA: adapters only in the optimizer and the checkpoints, a frozen base, merged export,
and the CLIs that read a LoRA run (generate, export-hf)."""

import json

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx

from cardjax import checkpoint
from cardjax.cli import main
from cardjax.config import load_config
from cardjax.data.prepare import prepare
from cardjax.errors import CheckpointError, ConfigError
from cardjax.model import ModelConfig, create_model
from cardjax.model import adapters
from cardjax.model.lora import count
from cardjax.model.lora_spec import LoraSpec, parse_targets
from cardjax.parallel import make_mesh
from cardjax.train import loop, train
from conftest import max_abs_diff, random_tokens

SMALL = ["--config.model.hidden_size=32", "--config.model.intermediate_size=64",
         "--config.data.batch_size=8", "--config.data.seq_len=64",
         "--config.data.options.train_size=240", "--config.data.options.test_size=8",
         "--config.train.progress=false", "--config.train.eval_every=0",
         "--config.train.eval_steps=1", "--config.train.log_every=5"]
LORA = ["--config.train.lora.rank=8", "--config.train.lr=1e-2",
        "--config.train.warmup_steps=0"]


def _config(root, name, *extra):
  return load_config(f"configs/{name}.py", [f"--config.data.data_dir={root / 'data'}",
                                            *SMALL, *extra])


@pytest.fixture(scope="module")
def sft(tmp_path_factory):
  """A tiny AR SFT run on arith_sft (80 steps): the base the LoRA runs adapt."""
  root = tmp_path_factory.mktemp("lora")
  config = _config(root, "tiny_sft", "--config.train.steps=80",
                   "--config.train.checkpoint_every=80")
  prepare(config)
  train(config, root / "sft")
  return root


def _mars_lora(root, *extra):
  return _config(root, "tiny_mars", f"--config.train.init_from={root / 'sft' / 'checkpoints'}",
                 *LORA, *extra)


def _pure(tree):
  return jax.tree.map(np.asarray, tree)


def _sft_params(sft):
  """The SFT checkpoint's weights as numpy: what a LoRA run's frozen base must stay."""
  model, _ = checkpoint.restore_model(sft / "sft" / "checkpoints")
  return _pure(nnx.to_pure_dict(nnx.state(model, nnx.Param)))


def _assert_only_adapters_train(job, sft_params):
  """The frozen tree is the SFT weights bit for bit; the trained params and AdamW's
  moments (mu and nu) are the adapters only."""
  jax.tree.map(np.testing.assert_array_equal, _pure(job.frozen), sft_params)
  assert all("lora" in str(p) for p, _ in jax.tree_util.tree_flatten_with_path(job.params)[0])
  moments = [x for x in jax.tree.leaves(job.opt_state) if x.ndim]
  assert sum(x.size for x in moments) == 2 * count(job.params)


def _base_and_unmerged(sft, run):
  """(the SFT base, base + the adapters of `run` unmerged) for lora_run's spec."""
  base, _ = checkpoint.restore_model(sft / "sft" / "checkpoints")
  restored = checkpoint.checkpoint_adapters(run / "checkpoints")
  return base, adapters.attach(base, LoraSpec(8, 16.0, ("q", "v", "down")), adapters=restored)


def test_lora_mars_trains_the_adapters_only(sft, tmp_path, capsys):
  """Rank-8 LoRA MARS from the SFT checkpoint: the noisy-stream loss falls, the base stays
  bit-identical, and the optimizer holds the adapters only (printed and counted)."""
  config = _mars_lora(sft, "--config.train.steps=40", "--config.train.checkpoint_every=40")
  sft_params = _sft_params(sft)
  mesh = make_mesh(1, 1, 1, devices=jax.devices()[:1])
  with jax.set_mesh(mesh):
    job = loop.setup(config, tmp_path / "run", mesh)
    base_before = _pure(job.frozen)
    adapters_before = _pure(job.params)
    loop._loop(job, loop.ProfileWindow(None, tmp_path / "p", job.start))
  # The frozen tree is the SFT model's weights, bit for bit, before and after training.
  jax.tree.map(np.testing.assert_array_equal, base_before, sft_params)
  _assert_only_adapters_train(job, sft_params)
  assert max(max_abs_diff(a, b) for a, b in zip(jax.tree.leaves(adapters_before),
                                                jax.tree.leaves(_pure(job.params)))) > 0
  # Trainable = the adapters: rank 8 on q, k, v, o, gate, up, down of 2 layers.
  cfg = job.cfg
  hd, h, kv, d, f = cfg.resolved_head_dim, cfg.num_heads, cfg.num_kv_heads, 32, 64
  per_layer = sum(8 * (i + o) for i, o in [(d, h * hd), (d, kv * hd), (d, kv * hd),
                                           (h * hd, d), (d, f), (d, f), (f, d)])
  assert count(job.params) == 2 * per_layer
  total = count(job.params) + count(sft_params)
  assert f"trainable parameters: {count(job.params):,} of {total:,}" in capsys.readouterr().out
  # The noisy stream learns: the mean of the last two logged intervals is well below the
  # first's.
  rows = [json.loads(line) for line in (tmp_path / "run" / "metrics.jsonl").open()]
  noisy = [r["train/mars/noisy"] for r in rows if "train/mars/noisy" in r]
  assert np.mean(noisy[-2:]) < 0.9 * noisy[0], noisy
  # The checkpoint holds the adapters (and a record of the base), not the base.
  saved = tmp_path / "run" / "checkpoints" / "40"
  assert (saved / "lora").is_dir()
  size = lambda p: sum(x.stat().st_size for x in p.rglob("*") if x.is_file())
  assert size(saved / "params") < 0.5 * size(sft / "sft" / "checkpoints" / "80" / "params")


def test_lora_mars_compact_stream_steps_like_the_full_one(sft, tmp_path):
  """LoRA MARS on packed arith rows: the compact noisy stream's first steps have the full
  stream's losses (the same objective for fewer tokens)."""
  mesh = make_mesh(1, 1, 1, devices=jax.devices()[:1])
  losses = {}
  for fraction in (1.0, 0.875):
    config = _mars_lora(sft, "--config.train.steps=3", "--config.train.checkpoint_every=0",
                        f"--config.objective.noisy_fraction={fraction}")
    with jax.set_mesh(mesh):
      job = loop.setup(config, tmp_path / f"run{fraction}", mesh)
      losses[fraction] = []
      for step in (1, 2, 3):
        job.advance(step)
        losses[fraction].append(float(job.metrics["loss"]))
      assert float(job.metrics.get("mars/noisy_overflow", 0.0)) == 0.0
      job.close()
  np.testing.assert_allclose(losses[0.875], losses[1.0], rtol=2e-5)


@pytest.mark.parametrize("objective", ["ar", "card", "mdlm", "bd3lm"])
def test_every_objective_trains_adapters_over_a_frozen_base(sft, objective, tmp_path):
  """LoRA is not MARS-only: each other objective, from the same SFT checkpoint, trains
  the adapters (its validation loss, on fixed batches and keys, falls) while the base
  stays bit-identical and out of the optimizer."""
  from cardjax.train import validation

  config = _config(sft, "tiny_sft", f"--config.objective.name={objective}",
                   f"--config.train.init_from={sft / 'sft' / 'checkpoints'}", *LORA,
                   "--config.train.steps=30", "--config.train.checkpoint_every=0",
                   "--config.train.lr=3e-3", "--config.train.eval_steps=2")
  sft_params = _sft_params(sft)
  mesh = make_mesh(1, 1, 1, devices=jax.devices()[:1])
  with jax.set_mesh(mesh):
    job = loop.setup(config, tmp_path / "run", mesh)
    before = validation.evaluate(job.eval_fn, job.params, job.eval_batches, job.mesh,
                                 job.frozen)["loss"]
    after = loop._loop(job, loop.ProfileWindow(None, tmp_path / "p", job.start))["eval"]["loss"]
  _assert_only_adapters_train(job, sft_params)
  assert after < before, (before, after)


@pytest.fixture(scope="module")
def lora_run(sft):
  """(run folder, train()'s result) of 10 LoRA MARS steps on q, v and down, alpha 16."""
  config = _mars_lora(sft, "--config.train.steps=10", "--config.train.checkpoint_every=10",
                      "--config.train.lora.targets=q,v,down", "--config.train.lora.alpha=16")
  return sft / "lora_run", train(config, sft / "lora_run")


def test_merged_export_equals_base_plus_adapters(sft, lora_run, tmp_path, capsys):
  """restore_model merges a LoRA checkpoint; export-hf writes that merge, and transformers'
  logits of the export equal the unmerged base + adapter logits within 1e-5."""
  import torch
  from transformers import AutoModelForCausalLM

  base, unmerged = _base_and_unmerged(sft, lora_run[0])
  ckpt = lora_run[0] / "checkpoints"
  merged, step = checkpoint.restore_model(ckpt)
  assert step == 10 and merged.lora is None
  tokens = random_tokens(merged.cfg.vocab_size, 2, 24)
  want = np.asarray(unmerged(jnp.asarray(tokens)))
  assert max_abs_diff(merged(jnp.asarray(tokens)), want) < 1e-5
  assert max_abs_diff(base(jnp.asarray(tokens)), want) > 1e-3  # the adapters do something
  assert main(["export-hf", str(ckpt), str(tmp_path / "hf")]) == 0
  theirs = AutoModelForCausalLM.from_pretrained(str(tmp_path / "hf"), dtype=torch.float32)
  with torch.no_grad():
    logits = theirs(torch.tensor(tokens, dtype=torch.long)).logits.numpy()
  assert max_abs_diff(logits, want) < 1e-5
  # generate reads base + adapters; MARS at tau 1 is AR greedy on the merged model.
  capsys.readouterr()
  args = ["generate", "--checkpoint", str(lora_run[0]), "--prompt", "3 + 4",
          "--max-new-tokens", "8"]
  assert main(args) == 0
  ar = capsys.readouterr().out
  assert main(args + ["--method", "mars", "--tau", "1.0"]) == 0
  assert capsys.readouterr().out.split("\n")[1] == ar.split("\n")[1]


def test_eval_and_serve_read_base_plus_adapters(sft, lora_run, tmp_path):
  """`cardjax eval --task nll` on the LoRA run is the trainer's own validation (which ran
  base + adapters unmerged); `cardjax serve` scores a prompt (echo, logprobs) with base +
  adapters, not with the base alone."""
  from serve_helpers import post, start_server

  run, result = lora_run
  out = tmp_path / "report.json"
  assert main(["eval", "--checkpoint", str(run), "--task", "nll", "--out", str(out)]) == 0
  metrics = json.loads(out.read_text())["runs"][0]["metrics"]
  assert metrics["ar_nll"] == pytest.approx(result["eval"]["ar_nll"], abs=1e-5)
  assert metrics["loss"] == pytest.approx(result["eval"]["loss"], abs=1e-5)

  base, unmerged = _base_and_unmerged(sft, run)
  tok = checkpoint.load_tokenizer(run / "checkpoints", base.cfg)
  prompt = "12 + 30 = 42 and 7 * 6 = 42"
  ids = tok.encode(prompt)

  def scores(model):  # log-probability of each prompt token after the first
    logits = np.asarray(model(jnp.asarray([ids], jnp.int32))[0], np.float64)
    shifted = logits - logits.max(-1, keepdims=True)
    logp = shifted - np.log(np.exp(shifted).sum(-1, keepdims=True))
    return logp[np.arange(len(ids) - 1), ids[1:]]

  proc, url = start_server(run, "--batch-sizes", "1", "--chunk", "1", "--max-tokens", "6")
  try:
    status, answer, _ = post(url, {"model": run.name, "prompt": prompt, "max_tokens": 0,
                                   "echo": True, "logprobs": 0})
  finally:
    proc.kill()
    proc.wait()
  assert status == 200, answer
  served = np.array(answer["choices"][0]["logprobs"]["token_logprobs"][1:], np.float64)
  assert np.abs(served - scores(unmerged)).max() < 1e-4
  assert np.abs(served - scores(base)).max() > 1e-3  # the adapters were applied


@pytest.mark.integration  # 45 s on 2 cores: two LoRA trainings and a resume
def test_resume_restores_the_adapters(sft, tmp_path):
  """A LoRA run stopped at step 6 and resumed to 12 ends where an unbroken 12-step run
  does: the adapters and their optimizer state come back, the base is re-read."""
  run = lambda steps, workdir: train(
      _mars_lora(sft, f"--config.train.steps={steps}", "--config.train.checkpoint_every=6",
                 "--config.train.lora.dropout=0.1", "--config.train.schedule=constant"),
      tmp_path / workdir)  # constant: the 6-step run's schedule is the 12-step run's start
  run(6, "broken")
  run(12, "broken")
  run(12, "whole")
  a = checkpoint.checkpoint_adapters(tmp_path / "broken" / "checkpoints")
  b = checkpoint.checkpoint_adapters(tmp_path / "whole" / "checkpoints")
  assert max(max_abs_diff(x, y) for x, y in zip(jax.tree.leaves(a), jax.tree.leaves(b))) < 1e-6


def test_bfloat16_base_and_a_moved_base(sft, tmp_path):
  """train.lora.base_dtype stores the frozen base in bfloat16; a checkpoint whose base has
  moved is one clear error, and --lora-base reads it from its new place."""
  import shutil
  config = _mars_lora(sft, "--config.train.steps=2", "--config.train.checkpoint_every=2",
                      "--config.train.lora.base_dtype=bfloat16")
  base_copy = tmp_path / "base"
  shutil.copytree(sft / "sft" / "checkpoints", base_copy)
  config.train.init_from = str(base_copy)
  mesh = make_mesh(1, 1, 1, devices=jax.devices()[:1])
  with jax.set_mesh(mesh):
    job = loop.setup(config, tmp_path / "run", mesh)
    assert {x.dtype for x in jax.tree.leaves(job.frozen)} == {jnp.dtype(jnp.bfloat16)}
    assert {x.dtype for x in jax.tree.leaves(job.params)} == {jnp.dtype(jnp.float32)}
    loop._loop(job, loop.ProfileWindow(None, tmp_path / "p", job.start))
  shutil.move(base_copy, tmp_path / "moved")
  with pytest.raises(CheckpointError, match="does not exist .*--lora-base PATH"):
    checkpoint.restore_model(tmp_path / "run" / "checkpoints")
  assert main(["export-hf", str(tmp_path / "run" / "checkpoints"), str(tmp_path / "hf"),
               "--lora-base", str(tmp_path / "moved")]) == 0
  assert (tmp_path / "hf" / "config.json").is_file()


def test_dropout_and_targets():
  """Dropout draws per row (only with keys: training); targets parse to one order."""
  base = create_model(ModelConfig(), seed=0)
  model = adapters.attach(base, LoraSpec(4, 8.0, ("q", "o", "up"), dropout=0.5))
  _, ad, _ = adapters.split(model)
  ad = jax.tree.map(lambda x: x + 0.1, ad)  # B = 0 at init would hide the dropout
  model = adapters.attach(base, LoraSpec(4, 8.0, ("q", "o", "up"), dropout=0.5), adapters=ad)
  tokens = jnp.asarray(random_tokens(512, 2, 8))
  keys = jax.vmap(lambda r: jax.random.fold_in(jax.random.key(0), r))(jnp.arange(2))
  plain = model(tokens)
  assert max_abs_diff(model(tokens, drop_keys=keys), plain) > 1e-3
  np.testing.assert_array_equal(model(tokens, drop_keys=keys), model(tokens, drop_keys=keys))
  assert max_abs_diff(adapters.merge(model)(tokens), plain) < 1e-5
  assert parse_targets("v, q") == ("q", "v") and parse_targets("all")[-1] == "down"
  with pytest.raises(ConfigError, match="name projections from q, k, v, o, gate, up, down"):
    parse_targets("q,qkv")


def test_bad_lora_configs_name_the_fix(tmp_path):
  with pytest.raises(ConfigError, match="adapts a trained model: set train.init_from"):
    load_config("configs/tiny_mars.py", ["--config.train.lora.rank=4"])
  with pytest.raises(ConfigError, match="train.lora.dropout=1.0 must lie in"):
    load_config("configs/tiny_mars.py", ["--config.train.lora.rank=4",
                                         "--config.train.init_from=x",
                                         "--config.train.lora.dropout=1.0"])
  with pytest.raises(ConfigError, match="base_dtype='fp8'"):
    load_config("configs/tiny_mars.py", ["--config.train.lora.rank=4",
                                         "--config.train.init_from=x",
                                         "--config.train.lora.base_dtype=fp8"])
