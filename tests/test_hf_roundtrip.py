"""cardjax.hf.save_pretrained writes folders that transformers and cardjax read back exactly."""

from __future__ import annotations

import json
import shutil

import jax
import numpy as np
import pytest
from flax import nnx
from safetensors.numpy import load_file

import cardjax.hf
from cardjax.model import ModelConfig, create_model
from conftest import PARITY_ATOL, cardjax_logits, max_abs_diff, random_tokens, torch_logits

LLAMA3_ROPE = {"rope_type": "llama3", "factor": 8.0, "low_freq_factor": 1.0,
               "high_freq_factor": 4.0, "original_max_position_embeddings": 32}

# name -> (family, seed, HF config kwargs)
CASES = {
    "qwen2_tied": ("qwen2", 21, dict(tie_word_embeddings=True)),
    "llama_untied_bias_llama3": ("llama", 22, dict(
        tie_word_embeddings=False, attention_bias=True, mlp_bias=True, head_dim=16,
        num_key_value_heads=1, rope_scaling=dict(LLAMA3_ROPE), max_position_embeddings=64)),
}
BATCH, SEQ = 2, 16
# Positions past original_max_position_embeddings=32, so an export that lost the rope
# scaling would show.
POSITIONS = np.stack([np.arange(20, 20 + SEQ), np.arange(40, 40 + SEQ)]).astype(np.int32)


def _source(factory, case):
  family, seed, config = CASES[case]
  return factory(family, seed=seed, **config)


def _hf_from_pretrained(path, **kwargs):
  from transformers import AutoModelForCausalLM
  return AutoModelForCausalLM.from_pretrained(str(path), attn_implementation="eager",
                                              **kwargs).eval()


def _flat_params(model) -> dict[str, np.ndarray]:
  flat = jax.tree_util.tree_flatten_with_path(
      nnx.state(model, nnx.Param), is_leaf=lambda x: isinstance(x, nnx.Variable))[0]
  return {jax.tree_util.keystr(path): np.asarray(v.get_value()) for path, v in flat}


def _safetensors(path) -> dict[str, np.ndarray]:
  out = {}
  for f in sorted(path.glob("*.safetensors")):
    tensors = load_file(str(f))
    assert not set(tensors) & set(out), f"{f.name} repeats tensors of another shard"
    out.update(tensors)
  return out


def _assert_params_bit_equal(a, b):
  pa, pb = _flat_params(a), _flat_params(b)
  assert sorted(pa) == sorted(pb)
  for key in pa:
    assert pa[key].dtype == pb[key].dtype, key
    np.testing.assert_array_equal(pa[key], pb[key], err_msg=key)


@pytest.mark.parametrize("case", sorted(CASES))
def test_export_loads_in_transformers(hf_model_factory, tmp_path, case):
  src, torch_model = _source(hf_model_factory, case)
  model = cardjax.hf.from_pretrained(src)
  out = cardjax.hf.save_pretrained(model, tmp_path / "export")
  assert (out / "config.json").is_file() and (out / "model.safetensors").is_file()

  reloaded = _hf_from_pretrained(out)
  assert type(reloaded) is type(torch_model)
  rc, oc = reloaded.config, torch_model.config
  for key in ("vocab_size", "hidden_size", "intermediate_size", "num_hidden_layers",
              "num_attention_heads", "num_key_value_heads", "tie_word_embeddings"):
    assert getattr(rc, key) == getattr(oc, key), key
  if case.startswith("llama"):
    assert (rc.head_dim, rc.attention_bias, rc.mlp_bias) == (16, True, True)
    assert rc.rope_parameters["rope_type"] == "llama3"
    assert rc.rope_parameters["factor"] == 8.0
    assert rc.rope_parameters["original_max_position_embeddings"] == 32

  tokens = random_tokens(oc.vocab_size, BATCH, SEQ, seed=5)
  expected = torch_logits(torch_model, tokens, position_ids=POSITIONS)
  got = torch_logits(reloaded, tokens, position_ids=POSITIONS)
  assert np.std(expected) > 0.3
  assert max_abs_diff(got, expected) < 1e-5


@pytest.mark.parametrize("case", sorted(CASES))
def test_import_export_import_is_bit_exact(hf_model_factory, tmp_path, case):
  src, _ = _source(hf_model_factory, case)
  model = cardjax.hf.from_pretrained(src)
  out = cardjax.hf.save_pretrained(model, tmp_path / "export")
  again = cardjax.hf.from_pretrained(out)
  assert again.cfg == model.cfg
  _assert_params_bit_equal(model, again)

  original, exported = _safetensors(src), _safetensors(out)
  assert sorted(exported) == sorted(original)
  for key, value in original.items():
    assert exported[key].dtype == value.dtype, key
    np.testing.assert_array_equal(exported[key], value, err_msg=key)


def test_sharded_export(hf_model_factory, tmp_path):
  src, torch_model = _source(hf_model_factory, "llama_untied_bias_llama3")
  model = cardjax.hf.from_pretrained(src)
  total = sum(v.nbytes for v in _safetensors(src).values())
  out = cardjax.hf.save_pretrained(model, tmp_path / "sharded", max_shard_bytes=total // 5)

  shards = sorted(out.glob("*.safetensors"))
  assert len(shards) >= 3, [s.name for s in shards]
  assert not (out / "model.safetensors").exists()
  index = json.loads((out / "model.safetensors.index.json").read_text())
  weight_map = index["weight_map"]
  assert set(weight_map.values()) == {s.name for s in shards}
  per_file: dict[str, set] = {}
  for key, name in weight_map.items():
    per_file.setdefault(name, set()).add(key)
  for shard in shards:
    assert set(load_file(str(shard))) == per_file[shard.name], shard.name
  exported = _safetensors(out)
  assert set(weight_map) == set(exported)
  assert index["metadata"]["total_size"] == sum(v.nbytes for v in exported.values()) == total

  _assert_params_bit_equal(model, cardjax.hf.from_pretrained(out))
  tokens = random_tokens(torch_model.config.vocab_size, BATCH, SEQ, seed=6)
  reloaded = _hf_from_pretrained(out)
  assert max_abs_diff(torch_logits(reloaded, tokens, POSITIONS),
                      torch_logits(torch_model, tokens, POSITIONS)) < 1e-5


def _tiny_tokenizer_json(path):
  from tokenizers import Tokenizer, models, pre_tokenizers, trainers

  tok = Tokenizer(models.BPE(unk_token="<unk>"))
  tok.pre_tokenizer = pre_tokenizers.Whitespace()
  trainer = trainers.BpeTrainer(vocab_size=60, special_tokens=["<unk>", "<eos>", "<mask>"])
  tok.train_from_iterator(["the cat sat on the mat", "a dog ate the cat food"] * 4, trainer)
  tok.save(str(path))
  return tok


def _with_assets(src, directory):
  shutil.copytree(src, directory)
  _tiny_tokenizer_json(directory / "tokenizer.json")
  (directory / "tokenizer_config.json").write_text(json.dumps({
      "tokenizer_class": "PreTrainedTokenizerFast", "eos_token": "<eos>",
      "unk_token": "<unk>", "model_max_length": 64}))
  (directory / "generation_config.json").write_text(json.dumps({
      "eos_token_id": 1, "max_new_tokens": 7, "do_sample": False}))
  (directory / "chat_template.jinja").write_text("{{ messages[0]['content'] }}")
  (directory / "notes.txt").write_text("not a tokenizer file")
  return directory


# A model never loaded from HF: llama with all biases and an explicit head_dim.
FRESH_CONFIG = ModelConfig(model_type="llama", vocab_size=160, hidden_size=48,
                           intermediate_size=96, num_layers=2, num_heads=4, num_kv_heads=2,
                           head_dim=16, qkv_bias=True, o_bias=True, mlp_bias=True,
                           tie_word_embeddings=False, initializer_range=0.2)
ASSETS = ("tokenizer.json", "tokenizer_config.json", "generation_config.json",
          "chat_template.jinja")


def test_assets_are_copied(hf_model_factory, tmp_path):
  src, _ = _source(hf_model_factory, "qwen2_tied")
  src = _with_assets(src, tmp_path / "src")
  out = cardjax.hf.save_pretrained(cardjax.hf.from_pretrained(src), tmp_path / "export")
  for name in ASSETS:
    assert (out / name).read_bytes() == (src / name).read_bytes(), name
  assert not (out / "notes.txt").exists()

  from transformers import AutoTokenizer, GenerationConfig
  tok = AutoTokenizer.from_pretrained(str(out))
  ids = tok("the cat sat")["input_ids"]
  assert ids and tok.decode(ids).replace(" ", "") == "thecatsat"
  assert GenerationConfig.from_pretrained(str(out)).max_new_tokens == 7


def test_assets_from_for_a_fresh_model(hf_model_factory, tmp_path):
  """A model that was never loaded from HF takes its tokenizer from `assets_from`, and its
  export reproduces its own logits in transformers."""
  src, _ = _source(hf_model_factory, "qwen2_tied")
  src = _with_assets(src, tmp_path / "src")
  cfg = FRESH_CONFIG
  model = create_model(cfg, seed=3)
  out = cardjax.hf.save_pretrained(model, tmp_path / "fresh", assets_from=src)
  for name in ASSETS:
    assert (out / name).read_bytes() == (src / name).read_bytes(), name

  tokens = random_tokens(cfg.vocab_size, BATCH, SEQ, seed=8)
  expected = cardjax_logits(model, tokens)
  assert np.std(expected) > 0.1
  got = torch_logits(_hf_from_pretrained(out), tokens)
  assert max_abs_diff(got, expected) < PARITY_ATOL


def test_fresh_model_without_assets_writes_none(tmp_path):
  out = cardjax.hf.save_pretrained(create_model(FRESH_CONFIG, seed=3), tmp_path / "bare")
  assert sorted(p.name for p in out.iterdir()) == ["config.json", "model.safetensors"]


def test_bfloat16_export(hf_model_factory, tmp_path):
  import ml_dtypes
  import torch

  src, torch_model = _source(hf_model_factory, "qwen2_tied")
  model = cardjax.hf.from_pretrained(src)
  out = cardjax.hf.save_pretrained(model, tmp_path / "bf16", dtype="bfloat16")
  config = json.loads((out / "config.json").read_text())
  assert config.get("torch_dtype", config.get("dtype")) == "bfloat16"
  assert config.get("dtype", "bfloat16") == "bfloat16"

  exported = _safetensors(out)
  original = _safetensors(src)
  assert sorted(exported) == sorted(original)
  for key, value in original.items():
    assert exported[key].dtype == ml_dtypes.bfloat16, key
    # Round-to-nearest-even, the same cast torch does.
    np.testing.assert_array_equal(exported[key], value.astype(ml_dtypes.bfloat16), err_msg=key)

  reloaded = _hf_from_pretrained(out)
  assert reloaded.config.dtype == torch.bfloat16
  assert all(p.dtype == torch.bfloat16 for p in reloaded.parameters())
  sd = torch_model.state_dict()
  for name, p in reloaded.state_dict().items():
    assert torch.equal(p, sd[name].to(torch.bfloat16)), name

  tokens = random_tokens(torch_model.config.vocab_size, BATCH, SEQ, seed=9)
  expected = torch_logits(torch_model, tokens)
  got = torch_logits(reloaded, tokens)
  assert np.all(np.isfinite(got))
  # bf16 weights and activations: close to fp32, not equal.
  diff = max_abs_diff(got, expected)
  assert 0 < diff < 0.1 * np.abs(expected).max()

  # cardjax reads the bf16 export back (into fp32 master weights) exactly.
  again = cardjax.hf.from_pretrained(out)
  for key, value in _flat_params(again).items():
    assert value.dtype == np.float32
  np.testing.assert_array_equal(
      np.asarray(again.embed.get_value()),
      original["model.embed_tokens.weight"].astype(ml_dtypes.bfloat16).astype(np.float32))


@pytest.mark.parametrize("case", sorted(CASES))
def test_scan_export_equals_list_export(hf_model_factory, tmp_path, case):
  src, _ = _source(hf_model_factory, case)
  listed = cardjax.hf.save_pretrained(cardjax.hf.from_pretrained(src), tmp_path / "list")
  scanned_model = cardjax.hf.from_pretrained(src, scan_layers=True)
  assert scanned_model.embed.get_value().shape == (scanned_model.cfg.vocab_size,
                                             scanned_model.cfg.hidden_size)
  scanned = cardjax.hf.save_pretrained(scanned_model, tmp_path / "scan")
  assert (json.loads((listed / "config.json").read_text())
          == json.loads((scanned / "config.json").read_text()))
  a, b = _safetensors(listed), _safetensors(scanned)
  assert sorted(a) == sorted(b)
  for key in a:
    assert a[key].dtype == b[key].dtype, key
    np.testing.assert_array_equal(a[key], b[key], err_msg=key)


@pytest.mark.parametrize("first,second", [(20_000, None), (None, 20_000)],
                         ids=["sharded_then_single", "single_then_sharded"])
def test_reexport_into_the_same_folder(hf_model_factory, tmp_path, first, second):
  """Exporting over an earlier export must leave only the new weights: otherwise cardjax
  (which prefers the index) and transformers (which prefers model.safetensors) read
  different models from one folder."""
  src, _ = _source(hf_model_factory, "qwen2_tied")
  old = cardjax.hf.from_pretrained(src)
  new = cardjax.hf.from_pretrained(src)
  new.embed.set_value(new.embed.get_value() + 1.0)
  out = tmp_path / "export"
  for model, shard in ((old, first), (new, second)):
    kwargs = {} if shard is None else {"max_shard_bytes": shard}  # 20 kB: several shards
    cardjax.hf.save_pretrained(model, out, **kwargs)
  want = np.asarray(new.embed.get_value())
  np.testing.assert_array_equal(np.asarray(cardjax.hf.from_pretrained(out).embed.get_value()),
                                want)
  reloaded = _hf_from_pretrained(out)
  np.testing.assert_array_equal(reloaded.model.embed_tokens.weight.detach().numpy(), want)
