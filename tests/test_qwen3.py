"""Qwen3: per-head q/k RMSNorm before rope, no biases by default, explicit head_dim.

Against random-init transformers Qwen3ForCausalLM models (fp32, every norm weight random, so
a q/k norm that is skipped, shared wrongly or applied after rope shows): logits through the
plain, scanned and KV-cache paths; export to a folder transformers loads; GGUF files written
as llama.cpp's converter writes qwen3; MARS at tau = 1 is AR greedy on a Qwen3-shaped model;
bad configs are one clear error.
"""

from __future__ import annotations

import json
import shutil
import zlib

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx

import cardjax.hf
from cardjax.decoding import generate, greedy_by_recompute, mars
from cardjax.errors import CheckpointError, ConfigError
from cardjax.hf.config import model_config_from_hf
from cardjax.model import ModelConfig, abstract_model, create_model, param_count
from cardjax.model.cache import KVCache
from conftest import (PARITY_ATOL, build_hf_model, cardjax_logits, max_abs_diff, random_tokens,
                      torch_logits)
from gguf_helpers import vocabulary, write_model

# name -> HF config kwargs (2 layers, vocab 160). The first two mirror the released shapes:
# Qwen3-0.6B has heads * head_dim = 2 * hidden (16 x 128 on 1024), tied; Qwen3-8B has
# heads * head_dim = hidden (32 x 128 on 4096), 4 query heads per kv head, untied.
CASES = {
    "like_0_6b": dict(hidden_size=64, num_attention_heads=4, num_key_value_heads=2,
                      head_dim=32, tie_word_embeddings=True, rope_theta=1e6),
    "like_8b": dict(hidden_size=64, num_attention_heads=8, num_key_value_heads=2, head_dim=8,
                    tie_word_embeddings=False, rope_theta=1e6),
    "kv1_bias": dict(hidden_size=64, num_attention_heads=4, num_key_value_heads=1,
                     head_dim=32, tie_word_embeddings=False, attention_bias=True),
}
BATCH, SEQ = 2, 16


def _source(factory, case):
  return factory("qwen3", seed=zlib.crc32(case.encode()) % 10_000, **CASES[case])


def _randomize_qk_norms(model, seed=0):
  """A cardjax model whose q/k norm weights are 1 + N(0, 0.3) instead of the init's ones."""
  key = jax.random.key(seed)
  state = nnx.state(model, nnx.Param)
  for path, var in jax.tree_util.tree_flatten_with_path(
      state, is_leaf=lambda x: isinstance(x, nnx.Variable))[0]:
    if str(path[-1].key) in ("q_norm", "k_norm"):
      key, sub = jax.random.split(key)
      value = var.get_value()
      var.set_value(1.0 + 0.3 * jax.random.normal(sub, value.shape, value.dtype))
  nnx.update(model, state)
  return model


# --- logits parity --------------------------------------------------------------------------


@pytest.mark.parametrize("case", sorted(CASES))
@pytest.mark.parametrize("scan", [False, True], ids=["list", "scan"])
def test_logits_match_transformers(hf_model_factory, case, scan):
  path, torch_model = _source(hf_model_factory, case)
  tokens = random_tokens(torch_model.config.vocab_size, BATCH, SEQ, seed=1)
  expected = torch_logits(torch_model, tokens)
  assert np.std(expected) > 0.3
  model = cardjax.hf.from_pretrained(path, scan_layers=scan)
  diff = max_abs_diff(cardjax_logits(model, tokens, jit=scan), expected)
  assert diff < PARITY_ATOL, f"{case} scan={scan}: max |diff| {diff}"


@pytest.mark.parametrize("case", sorted(CASES))
@pytest.mark.parametrize("scan", [False, True], ids=["list", "scan"])
def test_cached_forward_matches_transformers(hf_model_factory, case, scan):
  """Prefill 9 tokens, then 1, then 6, through the KV cache: every piece's logits are
  transformers' full-sequence logits (keys are normed before they are cached)."""
  path, torch_model = _source(hf_model_factory, case)
  tokens = random_tokens(torch_model.config.vocab_size, BATCH, SEQ, seed=2)
  expected = torch_logits(torch_model, tokens)
  model = cardjax.hf.from_pretrained(path, scan_layers=scan)
  step = nnx.jit(lambda m, t, c, p: m.forward_cached(t, c, positions=p))
  cache = KVCache.create(model.cfg, BATCH, SEQ)
  pieces = []
  for start, stop in ((0, 9), (9, 10), (10, SEQ)):
    pos = jnp.broadcast_to(jnp.arange(start, stop, dtype=jnp.int32), (BATCH, stop - start))
    logits, cache = step(model, jnp.asarray(tokens[:, start:stop]), cache, pos)
    pieces.append(np.asarray(logits))
  diff = max_abs_diff(np.concatenate(pieces, axis=1), expected)
  assert diff < PARITY_ATOL, f"{case} scan={scan} cached: max |diff| {diff}"


def test_qk_norm_weights_matter(hf_model_factory):
  """The parity above is a test of the q/k norms only if their weights change the logits."""
  path, torch_model = _source(hf_model_factory, "like_0_6b")
  tokens = random_tokens(torch_model.config.vocab_size, BATCH, SEQ, seed=1)
  model = cardjax.hf.from_pretrained(path)
  for block in model.layers:
    for name in ("q_norm", "k_norm"):
      var = getattr(block.attn, name)
      var.set_value(jnp.ones_like(var.get_value()))
  assert max_abs_diff(cardjax_logits(model, tokens), torch_logits(torch_model, tokens)) > 1e-2


@pytest.mark.parametrize("case", sorted(CASES))
def test_config_read_from_hf(hf_model_factory, case):
  path, torch_model = _source(hf_model_factory, case)
  hc = torch_model.config
  cfg = cardjax.hf.from_pretrained(path).cfg
  assert (cfg.model_type, cfg.qk_norm, cfg.mlp_bias) == ("qwen3", True, False)
  assert cfg.qkv_bias == cfg.o_bias == bool(hc.attention_bias)
  assert (cfg.num_heads, cfg.num_kv_heads, cfg.resolved_head_dim) == (
      hc.num_attention_heads, hc.num_key_value_heads, hc.head_dim)
  assert cfg.tie_word_embeddings == hc.tie_word_embeddings


def test_transformers4_layout_and_absent_head_dim(hf_model_factory, tmp_path):
  """config.json as transformers 4 wrote it (top-level rope_theta, no rope_parameters) reads
  the same; without head_dim both transformers and cardjax take Qwen3's default, 128."""
  from transformers import AutoConfig

  path, _ = _source(hf_model_factory, "like_8b")
  config = json.loads((path / "config.json").read_text())
  old = {k: v for k, v in config.items() if k != "rope_parameters"}
  old.update(rope_theta=config["rope_parameters"]["rope_theta"], rope_scaling=None)
  legacy = shutil.copytree(path, tmp_path / "legacy")
  (legacy / "config.json").write_text(json.dumps(old))
  assert cardjax.hf.from_pretrained(legacy).cfg == cardjax.hf.from_pretrained(path).cfg

  del old["head_dim"]
  (legacy / "config.json").write_text(json.dumps(old))
  assert AutoConfig.from_pretrained(str(legacy)).head_dim == 128
  assert model_config_from_hf(old).resolved_head_dim == 128


@pytest.mark.parametrize("hf,params", [
    # Qwen3-0.6B and Qwen3-8B as released (the model cards: 0.44B and 6.95B non-embedding).
    (dict(vocab_size=151936, hidden_size=1024, intermediate_size=3072, num_hidden_layers=28,
          num_attention_heads=16, num_key_value_heads=8, head_dim=128,
          tie_word_embeddings=True), 596_049_920),
    (dict(vocab_size=151936, hidden_size=4096, intermediate_size=12288, num_hidden_layers=36,
          num_attention_heads=32, num_key_value_heads=8, head_dim=128,
          tie_word_embeddings=False), 8_190_735_360),
], ids=["0.6B", "8B"])
def test_released_parameter_counts(hf, params):
  """cardjax's parameter count (the q/k norms included) equals transformers' for the
  released shapes, from shapes alone (torch's meta device, no memory)."""
  import torch
  from transformers import Qwen3Config, Qwen3ForCausalLM

  with torch.device("meta"):
    theirs = sum(p.numel() for p in Qwen3ForCausalLM(Qwen3Config(**hf)).parameters())
  cfg = model_config_from_hf(dict(hf, model_type="qwen3", rope_theta=1e6))
  assert param_count(abstract_model(cfg)) == theirs == params


# --- export ---------------------------------------------------------------------------------


def _native_qwen3(**changes) -> ModelConfig:
  base = dict(model_type="qwen3", qk_norm=True, qkv_bias=False, vocab_size=128,
              hidden_size=64, intermediate_size=96, num_layers=2, num_heads=4, num_kv_heads=2,
              head_dim=32, rope_theta=1e6, initializer_range=0.2, tie_word_embeddings=False)
  return ModelConfig(**{**base, **changes})


def _flat(model) -> dict[str, np.ndarray]:
  flat = jax.tree_util.tree_flatten_with_path(
      nnx.state(model, nnx.Param), is_leaf=lambda x: isinstance(x, nnx.Variable))[0]
  return {jax.tree_util.keystr(p): np.asarray(v.get_value()) for p, v in flat}


@pytest.mark.parametrize("changes", [{}, dict(tie_word_embeddings=True, qkv_bias=True,
                                              o_bias=True, scan_layers=True)],
                         ids=["untied", "tied_bias_scan"])
def test_export_round_trip(tmp_path, changes):
  """cardjax -> save_pretrained -> transformers loads it with the same logits ->
  from_pretrained gives the same parameters, bit for bit."""
  from transformers import AutoModelForCausalLM

  model = _randomize_qk_norms(create_model(_native_qwen3(**changes), seed=3))
  out = cardjax.hf.save_pretrained(model, tmp_path / "export")
  config = json.loads((out / "config.json").read_text())
  assert config["model_type"] == "qwen3" and config["architectures"] == ["Qwen3ForCausalLM"]
  assert config["head_dim"] == 32 and config["attention_bias"] == model.cfg.qkv_bias

  hf = AutoModelForCausalLM.from_pretrained(str(out), attn_implementation="eager").eval()
  assert type(hf).__name__ == "Qwen3ForCausalLM" and hf.config.head_dim == 32
  tokens = random_tokens(model.cfg.vocab_size, BATCH, SEQ, seed=4)
  expected = cardjax_logits(model, tokens, jit=True)
  assert np.std(expected) > 0.3
  assert max_abs_diff(torch_logits(hf, tokens), expected) < PARITY_ATOL

  again = cardjax.hf.from_pretrained(out, scan_layers=model.cfg.scan_layers)
  assert again.cfg == model.cfg
  a, b = _flat(model), _flat(again)
  assert sorted(a) == sorted(b) and any("q_norm" in k for k in a)
  for key in a:
    np.testing.assert_array_equal(a[key], b[key], err_msg=key)


# --- GGUF -----------------------------------------------------------------------------------

V = len(vocabulary()[0])
# transformers' GGUF loader maps no qwen3.attention.key_length onto head_dim (it takes
# Qwen3Config's default, 128), so the files it also reads use head_dim 128; the head_dim 32
# file is checked against the original torch model alone.
GGUF_CASES = {
    "F32_hd32": ("F32", dict(head_dim=32, tie_word_embeddings=False)),
    "F32_hd128": ("F32", dict(head_dim=128, tie_word_embeddings=False)),
    "Q8_0_hd128": ("Q8_0", dict(head_dim=128, tie_word_embeddings=True)),
}


@pytest.fixture(scope="module")
def gguf_file(tmp_path_factory):
  cache = {}

  def make(case):
    if case not in cache:
      qtype, config = GGUF_CASES[case]
      seed = zlib.crc32(case.encode()) % 10_000
      torch_model = build_hf_model("qwen3", seed=seed, vocab_size=V, hidden_size=64,
                                   intermediate_size=128, num_attention_heads=4,
                                   num_key_value_heads=2, rope_theta=1e6, rms_norm_eps=1e-6,
                                   **config)
      folder = tmp_path_factory.mktemp(f"gguf_qwen3_{case}")
      # llama.cpp writes Qwen3's vocabulary with the qwen2 pre-tokenizer.
      path = write_model(folder / f"{case}.gguf", torch_model, "qwen3", qtype, seed=seed,
                         pre="qwen2")
      cache[case] = (path, torch_model)
    return cache[case]

  return make


@pytest.mark.parametrize("case", list(GGUF_CASES))
def test_gguf_logits(gguf_file, case):
  import torch
  from transformers import AutoModelForCausalLM

  from cardjax.hf import gguf as g

  path, torch_model = gguf_file(case)
  qtype, config = GGUF_CASES[case]
  f = g.GGUFFile(path)
  assert f.type_name("blk.0.attn_q.weight") == qtype
  assert f.type_name("blk.1.attn_k_norm.weight") == "F32"
  model = cardjax.hf.from_gguf(path)
  cfg = model.cfg
  assert (cfg.model_type, cfg.qk_norm, cfg.qkv_bias, cfg.o_bias) == ("qwen3", True, False, False)
  assert (cfg.num_heads, cfg.num_kv_heads, cfg.resolved_head_dim) == (4, 2, config["head_dim"])
  assert cfg.tie_word_embeddings == config["tie_word_embeddings"]

  tokens = random_tokens(V, 3, 12, seed=7)
  got = cardjax_logits(model, tokens, jit=True)
  if qtype == "F32":
    diff = max_abs_diff(got, torch_logits(torch_model, tokens))
    assert diff < PARITY_ATOL, f"{case}: max |ours - original torch model| = {diff}"
  if config["head_dim"] == 128:
    ref = AutoModelForCausalLM.from_pretrained(str(path.parent), gguf_file=path.name,
                                               dtype=torch.float32,
                                               attn_implementation="eager").eval()
    assert type(ref).__name__ == "Qwen3ForCausalLM"
    expected = torch_logits(ref, tokens)
    assert np.std(expected) > 0.3
    diff = max_abs_diff(got, expected)
    assert diff < PARITY_ATOL, f"{case}: max |ours - transformers(gguf)| = {diff}"


def test_gguf_without_qk_norms_is_an_error(gguf_file, tmp_path):
  path, torch_model = gguf_file("F32_hd32")
  drop = tuple(f"blk.{i}.attn_{x}_norm.weight" for i in range(2) for x in "qk")
  bad = write_model(tmp_path / "no_norms.gguf", torch_model, "qwen3", drop=drop)
  with pytest.raises(CheckpointError, match="qwen3 model has per-head Q/K norms"):
    cardjax.hf.from_gguf(bad)


# --- MARS -----------------------------------------------------------------------------------

MASK = 63
PROMPTS = [[5, 9, 2, 33, 7], [1], [60, 61, 62], [8, 8, 8, 8, 8, 8, 8, 8]]


@pytest.fixture(scope="module", params=[False, True], ids=["list", "scan"])
def tiny_qwen3(request):
  """A Qwen3-shaped decoding model: head_dim 16 on hidden 32 with 4 heads (heads * head_dim
  = 2 * hidden, as Qwen3-0.6B), GQA, random q/k norms; peaked logits (init 0.3)."""
  cfg = _native_qwen3(vocab_size=64, hidden_size=32, intermediate_size=64, head_dim=16,
                      initializer_range=0.3, mask_token_id=MASK, scan_layers=request.param)
  return _randomize_qk_norms(create_model(cfg, seed=1), seed=1)


def test_cached_ar_equals_recompute(tiny_qwen3):
  expected = [greedy_by_recompute(tiny_qwen3, p, 12) for p in PROMPTS]
  assert generate(tiny_qwen3, PROMPTS, 12).rows() == expected
  assert len({tuple(r) for r in expected}) > 1  # the prompts decode differently


@pytest.mark.parametrize("window", mars.WINDOWS)
def test_mars_tau_one_is_ar_greedy(tiny_qwen3, window):
  ar = generate(tiny_qwen3, PROMPTS, 12).rows()
  out = mars.generate(tiny_qwen3, PROMPTS, 12, block=4, tau=1.0, mask_id=MASK, window=window)
  assert out.rows() == ar and out.forwards == 12


# --- errors ---------------------------------------------------------------------------------


def test_sliding_window_is_refused(hf_model_factory, tmp_path):
  path, _ = _source(hf_model_factory, "like_8b")
  folder = shutil.copytree(path, tmp_path / "model")
  config = json.loads((folder / "config.json").read_text())
  (folder / "config.json").write_text(json.dumps(dict(config, use_sliding_window=True)))
  with pytest.raises(CheckpointError, match="use_sliding_window=true is not implemented"):
    cardjax.hf.from_pretrained(folder)


def test_missing_q_norm_tensor_names_it(hf_model_factory, tmp_path):
  from safetensors.numpy import load_file, save_file

  path, _ = _source(hf_model_factory, "like_8b")
  folder = shutil.copytree(path, tmp_path / "model")
  tensors = load_file(str(folder / "model.safetensors"))
  del tensors["model.layers.1.self_attn.q_norm.weight"]
  save_file(tensors, str(folder / "model.safetensors"), metadata={"format": "pt"})
  with pytest.raises(CheckpointError, match=r"'model.layers.1.self_attn.q_norm.weight'.*"
                                            r"HF shape \[8\]"):
    cardjax.hf.from_pretrained(folder)


def test_bad_configs(tmp_path):
  with pytest.raises(ConfigError, match="model.qk_norm=False: model_type qwen3"):
    _native_qwen3(qk_norm=False).validate()
  for changes, match in [
      (dict(qkv_bias=True, o_bias=False), "qwen3's attention_bias covers q, k, v and o"),
      (dict(mlp_bias=True), "qwen3 has no MLP biases"),
      (dict(model_type="llama"), "llama has no q/k norms"),
  ]:
    model = create_model(_native_qwen3(num_layers=1, **changes))
    with pytest.raises(CheckpointError, match=match):
      cardjax.hf.save_pretrained(model, tmp_path / "out")
  assert not (tmp_path / "out").exists()
