"""Bad Hugging Face folders and bad inputs give one CardjaxError naming what is wrong."""

from __future__ import annotations

import json
import shutil

import numpy as np
import pytest
from safetensors.numpy import load_file, save_file

import cardjax.hf
from cardjax.errors import CardjaxError, CheckpointError, ConfigError
from cardjax.model import ModelConfig, create_model

FAMILY, SEED, CONFIG = "qwen2", 41, dict(tie_word_embeddings=False)


@pytest.fixture
def folder(hf_model_factory, tmp_path):
  """A private, editable copy of a good Qwen2 folder (hidden 48, 4 heads, 2 kv heads)."""
  src, _ = hf_model_factory(FAMILY, seed=SEED, **CONFIG)
  return shutil.copytree(src, tmp_path / "model")


def _edit_config(folder, **changes):
  path = folder / "config.json"
  config = json.loads(path.read_text())
  for key, value in changes.items():
    if value is _DELETE:
      del config[key]
    else:
      config[key] = value
  path.write_text(json.dumps(config))


_DELETE = object()


def _load_error(path, **kwargs) -> str:
  with pytest.raises(CheckpointError) as info:
    cardjax.hf.from_pretrained(path, **kwargs)
  return str(info.value)


def test_good_folder_loads(folder):
  """The baseline every other test breaks in one way."""
  assert cardjax.hf.from_pretrained(folder).cfg.num_kv_heads == 2


def test_missing_directory(tmp_path):
  missing = tmp_path / "no_such_model"
  msg = _load_error(missing)
  assert str(missing) in msg and "not a directory" in msg


def test_path_is_a_file(tmp_path):
  f = tmp_path / "config.json"
  f.write_text("{}")
  assert str(f) in _load_error(f)


def test_missing_config_json(folder):
  (folder / "config.json").unlink()
  msg = _load_error(folder)
  assert str(folder / "config.json") in msg and "missing" in msg


def test_config_json_not_json(folder):
  (folder / "config.json").write_text('{"model_type": "qwen2", ')
  msg = _load_error(folder)
  assert str(folder / "config.json") in msg and "JSON" in msg


def test_missing_weights(folder):
  (folder / "model.safetensors").unlink()
  msg = _load_error(folder)
  assert "model.safetensors" in msg and "model.safetensors.index.json" in msg
  assert str(folder) in msg
  assert "config.json" in msg  # lists what it did find


def test_only_pytorch_bin(folder):
  (folder / "model.safetensors").unlink()
  (folder / "pytorch_model.bin").write_bytes(b"\x80\x02not really a pickle")
  msg = _load_error(folder)
  assert "pytorch_model.bin" in msg and "safetensors" in msg


@pytest.mark.parametrize("model_type", ["gpt2", None])
def test_unsupported_model_type(folder, model_type):
  _edit_config(folder, model_type=model_type if model_type else _DELETE)
  msg = _load_error(folder)
  assert repr(model_type) in msg and "config.json" in msg
  assert "qwen2" in msg and "llama" in msg  # says what is supported


def test_missing_required_key(folder):
  _edit_config(folder, hidden_size=_DELETE)
  msg = _load_error(folder)
  assert "'hidden_size'" in msg and "config.json" in msg


def test_use_sliding_window(folder):
  _edit_config(folder, use_sliding_window=True)
  assert "use_sliding_window" in _load_error(folder)


def test_unsupported_activation(folder):
  _edit_config(folder, hidden_act="gelu")
  msg = _load_error(folder)
  assert "hidden_act" in msg and "gelu" in msg


def test_unsupported_rope_type(folder):
  _edit_config(folder, rope_parameters={"rope_type": "yarn", "factor": 4.0,
                                        "rope_theta": 10000.0})
  msg = _load_error(folder)
  assert "yarn" in msg and "config.json" in msg


def test_inconsistent_config(folder):
  _edit_config(folder, num_key_value_heads=3)
  msg = _load_error(folder)
  assert "num_kv_heads" in msg and "config.json" in msg


def test_tensor_missing(folder):
  key = "model.layers.1.mlp.up_proj.weight"
  tensors = load_file(str(folder / "model.safetensors"))
  del tensors[key]
  save_file(tensors, str(folder / "model.safetensors"), metadata={"format": "pt"})
  msg = _load_error(folder)
  assert repr(key) in msg and str(folder) in msg
  assert "[96, 48]" in msg  # the HF shape it expected


@pytest.mark.parametrize("key,bad_shape,good_shape", [
    ("model.layers.1.self_attn.k_proj.weight", (24, 40), (24, 48)),
    ("model.layers.0.self_attn.q_proj.bias", (40,), (48,)),
    ("model.embed_tokens.weight", (100, 48), (160, 48)),
    ("model.layers.0.mlp.down_proj.weight", (96, 48), (48, 96)),  # transposed
])
def test_tensor_misshaped(folder, key, bad_shape, good_shape):
  tensors = load_file(str(folder / "model.safetensors"))
  assert tensors[key].shape == good_shape
  tensors[key] = np.zeros(bad_shape, np.float32)
  save_file(tensors, str(folder / "model.safetensors"), metadata={"format": "pt"})
  msg = _load_error(folder)
  assert repr(key) in msg
  assert str(list(bad_shape)) in msg and str(list(good_shape)) in msg
  assert "model.safetensors" in msg


def test_unreadable_safetensors(folder):
  (folder / "model.safetensors").write_bytes(b"this is not a safetensors file")
  msg = _load_error(folder)
  assert str(folder / "model.safetensors") in msg


def _sharded(folder, tmp_path):
  model = cardjax.hf.from_pretrained(folder)
  out = cardjax.hf.save_pretrained(model, tmp_path / "sharded", max_shard_bytes=40_000)
  shards = sorted(out.glob("model-*.safetensors"))
  assert len(shards) >= 3
  return out, shards


def test_index_names_missing_shard(folder, tmp_path):
  out, shards = _sharded(folder, tmp_path)
  shards[1].unlink()
  msg = _load_error(out)
  assert shards[1].name in msg and "model.safetensors.index.json" in msg


def test_index_not_json(folder, tmp_path):
  out, _ = _sharded(folder, tmp_path)
  (out / "model.safetensors.index.json").write_text("[1, 2")
  assert "model.safetensors.index.json" in _load_error(out)


@pytest.fixture(scope="module")
def small_model():
  cfg = ModelConfig(vocab_size=64, hidden_size=32, intermediate_size=64, num_heads=4,
                    num_kv_heads=2)
  return create_model(cfg, seed=0)


@pytest.mark.parametrize("bad_id", [64, 1000, -1])
def test_token_ids_out_of_range(small_model, bad_id):
  tokens = np.zeros((2, 8), np.int32)
  tokens[1, 3] = bad_id
  with pytest.raises(CardjaxError) as info:
    small_model(tokens)
  msg = str(info.value)
  assert "vocab_size=64" in msg and str(bad_id) in msg


def test_token_ids_at_the_edges_are_fine(small_model):
  tokens = np.array([[0, 63, 5, 7]], np.int32)
  logits = small_model(tokens)
  assert logits.shape == (1, 4, 64) and np.all(np.isfinite(np.asarray(logits)))


@pytest.mark.parametrize("tokens", [np.zeros((8,), np.int32), np.zeros((2, 8), np.float32)],
                         ids=["1d", "float"])
def test_tokens_bad_rank_or_dtype(small_model, tokens):
  with pytest.raises(CardjaxError) as info:
    small_model(tokens)
  assert "tokens" in str(info.value) and str(list(tokens.shape)) in str(info.value)


def test_export_errors(tmp_path):
  """Settings transformers' classes cannot express are refused at export, not silently
  written into a folder that loads into a different model."""
  base = dict(vocab_size=64, hidden_size=32, intermediate_size=64, num_heads=4, num_kv_heads=2)
  qwen_o_bias = create_model(ModelConfig(model_type="qwen2", o_bias=True, **base))
  with pytest.raises(CheckpointError, match="bias"):
    cardjax.hf.save_pretrained(qwen_o_bias, tmp_path / "b")
  llama_split_bias = create_model(ModelConfig(model_type="llama", qkv_bias=True, o_bias=False,
                                              **base))
  with pytest.raises(CheckpointError, match="attention_bias"):
    cardjax.hf.save_pretrained(llama_split_bias, tmp_path / "c")
  assert not any((tmp_path / d / "model.safetensors").exists() for d in "bc")


def test_error_hierarchy():
  assert issubclass(CheckpointError, CardjaxError) and issubclass(ConfigError, CardjaxError)
  assert issubclass(CardjaxError, ValueError)


# --- malformed values: one CheckpointError, never a raw Python error ----------------------


@pytest.mark.parametrize("key,value", [
    (None, [1, 2]),  # the whole file is a list
    ("vocab_size", None),
    ("num_attention_heads", "four"),
    ("rope_parameters", [1]),
], ids=["not_an_object", "null_vocab", "str_heads", "rope_list"])
def test_malformed_config_values(folder, key, value):
  if key is None:
    (folder / "config.json").write_text(json.dumps(value))
  else:
    _edit_config(folder, **{key: value})
  msg = _load_error(folder)
  assert "config.json" in msg and (key is None or key in msg)


def test_index_maps_key_to_the_wrong_shard(folder, tmp_path):
  out, shards = _sharded(folder, tmp_path)
  index_path = out / "model.safetensors.index.json"
  index = json.loads(index_path.read_text())
  key = "model.layers.1.mlp.up_proj.weight"
  assert index["weight_map"][key] != shards[0].name
  index["weight_map"][key] = shards[0].name  # a shard that does not hold it
  index_path.write_text(json.dumps(index))
  msg = _load_error(out)
  assert repr(key) in msg or key in msg
  assert shards[0].name in msg


def test_index_not_an_object(folder, tmp_path):
  out, _ = _sharded(folder, tmp_path)
  (out / "model.safetensors.index.json").write_text("[1, 2]")
  assert "model.safetensors.index.json" in _load_error(out)
