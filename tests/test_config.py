"""Config files, overrides and validation; the published Qwen2.5 definitions."""

import json
from pathlib import Path

import pytest

from cardjax.config import apply_overrides, base_config, load_config, merge_into_base, model_config
from cardjax.errors import ConfigError
from cardjax.hf.config import model_config_from_hf
from cardjax.model import abstract_model, param_count

DATA = Path(__file__).parent / "data"
ARCH_FIELDS = ("model_type", "vocab_size", "hidden_size", "intermediate_size", "num_layers",
               "num_heads", "num_kv_heads", "rms_norm_eps", "rope_theta",
               "max_position_embeddings", "tie_word_embeddings", "qkv_bias", "o_bias",
               "bos_token_id", "eos_token_id", "resolved_head_dim")


@pytest.mark.parametrize("name,published,params", [
    ("qwen2_5_0_5b", "qwen2_5_0_5b_instruct_config.json", 494_032_768),
    ("qwen2_5_7b", "qwen2_5_7b_instruct_config.json", 7_615_616_512),
])
def test_qwen_configs_equal_published(name, published, params):
  ours = model_config(load_config(f"configs/{name}.py"))
  theirs = model_config_from_hf(json.loads((DATA / published).read_text()))
  for field in ARCH_FIELDS:
    assert getattr(ours, field) == getattr(theirs, field), field
  # The published parameter counts (0.49B and 7.61B), from shapes alone (no memory).
  assert param_count(abstract_model(ours)) == params


def test_tiny_config_loads_by_path_and_name():
  a = load_config("configs/tiny.py")
  b = load_config("tiny")
  assert a.to_dict() == b.to_dict()
  assert model_config(a).num_layers == 2


def test_overrides_are_typed():
  c = load_config("configs/tiny.py", ["--config.model.num_layers=3",
                                      "--config.model.dtype=bfloat16",
                                      "--config.model.rope_theta=500", "--config.seed=7",
                                      "--config.model.scan_layers=true"])
  assert c.model.num_layers == 3 and isinstance(c.model.num_layers, int)
  assert c.model.dtype == "bfloat16"
  assert c.model.rope_theta == 500.0 and isinstance(c.model.rope_theta, float)
  assert c.seed == 7 and c.model.scan_layers is True
  # A text field keeps its text even where it reads as None or a number.
  c = load_config("configs/tiny.py", ["--config.model.remat=none", "--config.name=123"])
  assert c.model.remat == "none" and c.name == "123"


@pytest.mark.parametrize("override,needle", [
    ("--config.model.num_layer=3", "did you mean 'model.num_layers'"),
    ("--config.modl.num_layers=3", "did you mean 'model'"),
    ("--config.model.num_layers=abc", "model.num_layers='abc'"),
    ("--config.model.qkv_bias=1", "expected true or false"),
    ("--config.model.dtype=float64", "model.dtype='float64'"),
    ("--config.model.num_kv_heads=3", "must divide num_heads=4"),
    ("--config.model.mask_token_id=512", "mask_token_id"),
    ("--config.mesh.data=0", "mesh.data=0"),
    ("config.model.num_layers", "cannot parse override"),
])
def test_bad_overrides_name_the_key(override, needle):
  with pytest.raises(ConfigError, match=None) as info:
    load_config("configs/tiny.py", [override])
  assert needle in str(info.value)


def test_unknown_key_in_config_file(tmp_path):
  f = tmp_path / "bad.py"
  f.write_text("from cardjax.config import base_config\n"
               "def get_config():\n  c = base_config()\n  c.model.num_hiden_layers = 3\n"
               "  return c\n")
  with pytest.raises(ConfigError, match="model.num_hiden_layers"):
    load_config(str(f))


def test_config_file_with_arg_and_partial_dict(tmp_path):
  f = tmp_path / "arg.py"
  f.write_text("import ml_collections\n"
               "def get_config(layers):\n"
               "  return ml_collections.ConfigDict({'model': {'num_layers': int(layers)}})\n")
  c = load_config(f"{f}:5")
  assert c.model.num_layers == 5
  assert c.model.hidden_size == base_config().model.hidden_size  # defaults filled in


def test_missing_config_file_and_function(tmp_path):
  with pytest.raises(ConfigError, match="not found"):
    load_config(str(tmp_path / "nope.py"))
  f = tmp_path / "empty.py"
  f.write_text("x = 1\n")
  with pytest.raises(ConfigError, match="no get_config"):
    load_config(str(f))


def test_section_replaced_by_scalar_is_an_error():
  with pytest.raises(ConfigError, match="is a section"):
    merge_into_base({"model": 3})


def test_apply_overrides_on_base():
  c = apply_overrides(base_config(), ["config.mesh.tensor=2"])
  assert c.mesh.tensor == 2


def test_splash_block_objectives_need_whole_block_documents():
  """MARS / BD3LM over packed rows with splash (or auto, which picks it on TPU) need
  documents padded to whole blocks; the error names both fixes, and either one loads."""
  with pytest.raises(ConfigError, match=r"pad_to_multiple=1 must be a multiple of "
                                        r"objective.block_size=4.*attention_impl=xla"):
    load_config("configs/tiny_bd3lm.py", ["--config.model.attention_impl=splash"])
  for fix in ("--config.data.pad_to_multiple=4", "--config.model.attention_impl=xla"):
    load_config("configs/tiny_bd3lm.py", ["--config.model.attention_impl=auto", fix]
                if "pad" in fix else [fix])
