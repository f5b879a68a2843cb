"""cardjax.hf.from_pretrained gives the same fp32 logits as transformers, shape by shape."""

from __future__ import annotations

import json
import shutil
import zlib

import numpy as np
import pytest

import cardjax.hf
from conftest import PARITY_ATOL, cardjax_logits, max_abs_diff, random_tokens, torch_logits

LLAMA3_ROPE = {"rope_type": "llama3", "factor": 8.0, "low_freq_factor": 1.0,
               "high_freq_factor": 4.0, "original_max_position_embeddings": 32}

# name -> (family, HF config kwargs). Every case has 2 layers and fp32 weights.
CASES = {
    "qwen2_tied": ("qwen2", dict(tie_word_embeddings=True)),
    "qwen2_untied": ("qwen2", dict(tie_word_embeddings=False)),
    "qwen2_kv1": ("qwen2", dict(num_attention_heads=4, num_key_value_heads=1)),
    "qwen2_mha": ("qwen2", dict(num_attention_heads=4, num_key_value_heads=4)),
    "qwen2_odd_widths": ("qwen2", dict(hidden_size=72, num_attention_heads=6,
                                       num_key_value_heads=2, intermediate_size=100,
                                       vocab_size=257, tie_word_embeddings=False)),
    # transformers' Qwen2 reads an optional head_dim too (getattr with hidden/heads default).
    "qwen2_head_dim": ("qwen2", dict(head_dim=16)),
    "llama_no_bias": ("llama", dict(attention_bias=False, mlp_bias=False)),
    "llama_all_bias": ("llama", dict(attention_bias=True, mlp_bias=True,
                                     tie_word_embeddings=True)),
    "llama_head_dim": ("llama", dict(hidden_size=48, num_attention_heads=4, head_dim=16,
                                     num_key_value_heads=2)),
    "llama3_rope": ("llama", dict(rope_scaling=dict(LLAMA3_ROPE), max_position_embeddings=64,
                                  num_key_value_heads=1)),
    "llama_linear_rope": ("llama", dict(rope_scaling={"rope_type": "linear", "factor": 2.0},
                                        rope_theta=500000.0)),
}
ROPE_SCALED = ("llama3_rope", "llama_linear_rope")

# (scan_layers, remat). Scan + full remat compiles one more scan body per shape, so it runs
# on two representative cases only.
MODES = [(False, "none"), (True, "none"), (False, "full"), (True, "full")]
SCAN_REMAT_CASES = ("qwen2_untied", "llama3_rope")
BATCH, SEQ = 2, 16


def _source(factory, case):
  """(folder, torch model) of a case; each case has its own fixed seed."""
  family, config = CASES[case]
  return factory(family, seed=zlib.crc32(case.encode()) % 10_000, **config)


def _positions(case: str):
  """Explicit positions for the rope-scaling cases: rows start at 20 and 40, so most of them
  lie past original_max_position_embeddings=32 where llama3 scaling changes the angles."""
  if case not in ROPE_SCALED:
    return None
  return np.stack([np.arange(20, 20 + SEQ), np.arange(40, 40 + SEQ)]).astype(np.int32)


@pytest.mark.parametrize("case,mode", [
    (case, mode) for case in sorted(CASES) for mode in MODES
    if mode != (True, "full") or case in SCAN_REMAT_CASES
], ids=lambda v: v if isinstance(v, str) else f"scan={v[0]}-remat={v[1]}")
def test_logits_match_transformers(hf_model_factory, case, mode):
  path, torch_model = _source(hf_model_factory, case)
  scan, remat = mode
  vocab = torch_model.config.vocab_size
  tokens = random_tokens(vocab, BATCH, SEQ, seed=1)
  positions = _positions(case)

  expected = torch_logits(torch_model, tokens, position_ids=positions)
  # Guard against a test that compares two near-zero tensors.
  assert np.std(expected) > 0.3, np.std(expected)

  model = cardjax.hf.from_pretrained(path, scan_layers=scan, remat=remat)
  assert model.cfg.scan_layers == scan and model.cfg.remat == remat
  kwargs = {} if positions is None else {"positions": positions}
  # The plain list model runs eagerly (the path users poke at); the others under nnx.jit.
  got = cardjax_logits(model, tokens, jit=(scan or remat != "none"), **kwargs)
  assert got.dtype == np.float32
  assert got.shape == (BATCH, SEQ, vocab)
  diff = max_abs_diff(got, expected)
  assert diff < PARITY_ATOL, f"{case} scan={scan} remat={remat}: max |diff| {diff}"


@pytest.mark.parametrize("case", sorted(CASES))
def test_config_read_from_hf(hf_model_factory, case):
  family, config = CASES[case]
  path, torch_model = _source(hf_model_factory, case)
  hc = torch_model.config
  cfg = cardjax.hf.from_pretrained(path).cfg
  assert cfg.model_type == family
  assert cfg.vocab_size == hc.vocab_size
  assert cfg.hidden_size == hc.hidden_size
  assert cfg.intermediate_size == hc.intermediate_size
  assert cfg.num_layers == hc.num_hidden_layers
  assert cfg.num_heads == hc.num_attention_heads
  assert cfg.num_kv_heads == hc.num_key_value_heads
  head_dim = getattr(hc, "head_dim", None) or hc.hidden_size // hc.num_attention_heads
  assert cfg.resolved_head_dim == head_dim
  assert cfg.resolved_head_dim == config.get("head_dim", head_dim)
  assert cfg.tie_word_embeddings == bool(hc.tie_word_embeddings)
  if family == "qwen2":
    assert (cfg.qkv_bias, cfg.o_bias, cfg.mlp_bias) == (True, False, False)
  else:
    assert cfg.qkv_bias == cfg.o_bias == bool(hc.attention_bias)
    assert cfg.mlp_bias == bool(hc.mlp_bias)
  if case == "llama3_rope":
    assert (cfg.rope_type, cfg.rope_factor, cfg.rope_original_max_position) == ("llama3", 8.0, 32)
    assert (cfg.rope_low_freq_factor, cfg.rope_high_freq_factor) == (1.0, 4.0)
  if case == "llama_linear_rope":
    assert (cfg.rope_type, cfg.rope_factor, cfg.rope_theta) == ("linear", 2.0, 500000.0)


@pytest.mark.parametrize("case", ROPE_SCALED)
def test_rope_scaling_matters(hf_model_factory, case):
  """A rope case is only a test of the scaling if ignoring it changes the logits."""
  path, torch_model = _source(hf_model_factory, case)
  tokens = random_tokens(torch_model.config.vocab_size, BATCH, SEQ, seed=1)
  positions = _positions(case)
  expected = torch_logits(torch_model, tokens, position_ids=positions)
  unscaled = cardjax.hf.from_pretrained(path, rope_type="default")
  diff = max_abs_diff(cardjax_logits(unscaled, tokens, positions=positions), expected)
  assert diff > 1e-2, f"plain rope is indistinguishable from {case} (diff {diff})"


@pytest.mark.parametrize("case", ROPE_SCALED)
def test_transformers4_config_layout(hf_model_factory, tmp_path, case):
  """config.json as transformers 4 wrote it (top-level rope_theta, `rope_scaling` with the
  old `type` key, no rope_parameters) reads into the same ModelConfig."""
  config = CASES[case][1]
  path, _ = _source(hf_model_factory, case)
  new = json.loads((path / "config.json").read_text())
  old = dict(new)
  rope = dict(old.pop("rope_parameters"))
  old["rope_theta"] = rope.pop("rope_theta")
  rope["type"] = rope.pop("rope_type")
  old["rope_scaling"] = rope
  legacy = shutil.copytree(path, tmp_path / "legacy")
  (legacy / "config.json").write_text(json.dumps(old))
  want = cardjax.hf.from_pretrained(path).cfg
  got = cardjax.hf.from_pretrained(legacy).cfg
  assert got == want
  assert want.rope_type == config["rope_scaling"]["rope_type"]
  assert want.rope_theta == config.get("rope_theta", 10000.0)


def test_tied_and_untied_heads(hf_model_factory):
  tied_path, _ = _source(hf_model_factory, "qwen2_tied")
  untied_path, untied_torch = _source(hf_model_factory, "qwen2_untied")
  tied = cardjax.hf.from_pretrained(tied_path)
  untied = cardjax.hf.from_pretrained(untied_path)
  assert not hasattr(tied, "lm_head")
  np.testing.assert_array_equal(
      np.asarray(untied.lm_head.get_value()), untied_torch.lm_head.weight.detach().numpy())
  # Different matrices, really: the test of the untied head is not a tied one in disguise.
  assert not np.array_equal(np.asarray(untied.lm_head.get_value()),
                            np.asarray(untied.embed.get_value()))


@pytest.mark.parametrize("scan", [False, True], ids=["list", "scan"])
def test_packed_segments_equal_separate_documents(hf_model_factory, scan):
  """Two documents packed in one row (segment ids 1 and 2, positions restarting at 0) give
  the logits of running each document alone through transformers."""
  path, torch_model = _source(hf_model_factory, "qwen2_untied")
  vocab = torch_model.config.vocab_size
  splits = [(7, 9), (12, 4)]  # per batch row: (len doc 1, len doc 2); SEQ in all
  tokens = random_tokens(vocab, len(splits), SEQ, seed=3)
  positions = np.stack([np.concatenate([np.arange(a), np.arange(b)]) for a, b in splits])
  segments = np.stack([np.array([1] * a + [2] * b) for a, b in splits])

  model = cardjax.hf.from_pretrained(path, scan_layers=scan)
  got = cardjax_logits(model, tokens, positions=positions, segment_ids=segments)
  for row, (a, b) in enumerate(splits):
    first = torch_logits(torch_model, tokens[row:row + 1, :a])[0]
    second = torch_logits(torch_model, tokens[row:row + 1, a:])[0]
    assert max_abs_diff(got[row, :a], first) < PARITY_ATOL
    assert max_abs_diff(got[row, a:], second) < PARITY_ATOL

  # Without segment ids the second document sees the first: the logits must differ, so the
  # equality above is evidence that the segments were honoured.
  unpacked = cardjax_logits(model, tokens, positions=positions)
  a = splits[0][0]
  assert max_abs_diff(unpacked[0, a:], got[0, a:]) > 1e-2


def _cardjax_grads(model, tokens, targets):
  """HF-named gradients of the mean next-token cross-entropy, via hf_tensors on a Decoder
  whose parameters are the gradients (so names and layouts come from the export map)."""
  import jax
  import jax.numpy as jnp
  from flax import nnx

  graphdef, params, rest = nnx.split(model, nnx.Param, ...)

  @jax.jit
  def grad_fn(params, rest):
    def loss(params):
      logits = nnx.merge(graphdef, params, rest)(tokens)
      logp = jax.nn.log_softmax(logits, axis=-1)
      return -jnp.mean(jnp.take_along_axis(logp, targets[..., None], axis=-1))
    return jax.value_and_grad(loss)(params)

  value, grads = grad_fn(params, rest)
  grad_model = nnx.merge(graphdef, grads, rest)
  return float(value), dict(cardjax.hf.hf_tensors(grad_model))


@pytest.mark.parametrize("scan,remat", [(False, "none"), (False, "full"), (True, "dots")])
def test_gradients_match_transformers(hf_model_factory, scan, remat):
  """Training parity: the loss and every parameter's gradient equal torch's, with and without
  rematerialisation (remat only changes what the backward pass recomputes)."""
  import torch

  path, torch_model = _source(hf_model_factory, "llama_all_bias")
  vocab = torch_model.config.vocab_size
  tokens = random_tokens(vocab, BATCH, SEQ, seed=4)
  targets = random_tokens(vocab, BATCH, SEQ, seed=5)

  torch_model.zero_grad()
  logits = torch_model(input_ids=torch.as_tensor(tokens, dtype=torch.long), use_cache=False).logits
  loss = torch.nn.functional.cross_entropy(logits.reshape(-1, vocab),
                                           torch.as_tensor(targets, dtype=torch.long).reshape(-1))
  loss.backward()
  expected = {n: p.grad.numpy().copy() for n, p in torch_model.named_parameters()}
  torch_model.zero_grad()

  model = cardjax.hf.from_pretrained(path, scan_layers=scan, remat=remat)
  value, grads = _cardjax_grads(model, tokens, targets)
  assert abs(value - loss.item()) < 1e-5
  # Tied: torch lists the shared matrix once, as the embedding.
  assert sorted(grads) == sorted(expected)
  for name, g in expected.items():
    scale = max(float(np.abs(g).max()), 1e-3)
    assert max_abs_diff(grads[name], g) < 1e-4 * scale, name
