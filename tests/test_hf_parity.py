"""cardjax.hf.from_pretrained gives the same fp32 logits as transformers, shape by shape."""

from __future__ import annotations

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
    "llama_no_bias": ("llama", dict(attention_bias=False, mlp_bias=False)),
    "llama_all_bias": ("llama", dict(attention_bias=True, mlp_bias=True,
                                     tie_word_embeddings=True)),
    "llama_head_dim": ("llama", dict(hidden_size=48, num_attention_heads=4, head_dim=16,
                                     num_key_value_heads=2)),
    "llama3_rope": ("llama", dict(rope_scaling=dict(LLAMA3_ROPE), max_position_embeddings=64,
                                  num_key_value_heads=1)),
}

# (scan_layers, remat)
MODES = [(False, "none"), (True, "none"), (False, "full"), (True, "full")]
BATCH, SEQ = 2, 16


def _positions(case: str):
  """Explicit positions for the rope-scaling case: rows start at 20 and 40, so most of them
  lie past original_max_position_embeddings=32 where llama3 scaling changes the angles."""
  if case != "llama3_rope":
    return None
  return np.stack([np.arange(20, 20 + SEQ), np.arange(40, 40 + SEQ)]).astype(np.int32)


@pytest.mark.parametrize("mode", MODES, ids=lambda m: f"scan={m[0]}-remat={m[1]}")
@pytest.mark.parametrize("case", sorted(CASES))
def test_logits_match_transformers(hf_model_factory, case, mode):
  family, config = CASES[case]
  path, torch_model = hf_model_factory(family, seed=len(case), **config)
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
  got = cardjax_logits(model, tokens, **kwargs)
  assert got.dtype == np.float32
  assert got.shape == (BATCH, SEQ, vocab)
  diff = max_abs_diff(got, expected)
  assert diff < PARITY_ATOL, f"{case} scan={scan} remat={remat}: max |diff| {diff}"


@pytest.mark.parametrize("case", sorted(CASES))
def test_config_read_from_hf(hf_model_factory, case):
  family, config = CASES[case]
  path, torch_model = hf_model_factory(family, seed=len(case), **config)
  hc = torch_model.config
  cfg = cardjax.hf.from_pretrained(path).cfg
  assert cfg.model_type == family
  assert cfg.vocab_size == hc.vocab_size
  assert cfg.hidden_size == hc.hidden_size
  assert cfg.intermediate_size == hc.intermediate_size
  assert cfg.num_layers == hc.num_hidden_layers
  assert cfg.num_heads == hc.num_attention_heads
  assert cfg.num_kv_heads == hc.num_key_value_heads
  assert cfg.resolved_head_dim == getattr(hc, "head_dim", None) or (
      hc.hidden_size // hc.num_attention_heads)
  assert cfg.tie_word_embeddings == bool(hc.tie_word_embeddings)
  if family == "qwen2":
    assert (cfg.qkv_bias, cfg.o_bias, cfg.mlp_bias) == (True, False, False)
  else:
    assert cfg.qkv_bias == cfg.o_bias == bool(hc.attention_bias)
    assert cfg.mlp_bias == bool(hc.mlp_bias)
  if case == "llama3_rope":
    assert (cfg.rope_type, cfg.rope_factor, cfg.rope_original_max_position) == ("llama3", 8.0, 32)


def test_llama3_scaling_matters(hf_model_factory):
  """The rope case is only a test of the scaling if ignoring it changes the logits."""
  family, config = CASES["llama3_rope"]
  path, torch_model = hf_model_factory(family, seed=len("llama3_rope"), **config)
  tokens = random_tokens(torch_model.config.vocab_size, BATCH, SEQ, seed=1)
  positions = _positions("llama3_rope")
  expected = torch_logits(torch_model, tokens, position_ids=positions)
  unscaled = cardjax.hf.from_pretrained(path, rope_type="default")
  diff = max_abs_diff(cardjax_logits(unscaled, tokens, positions=positions), expected)
  assert diff > 1e-2, f"plain rope is indistinguishable from llama3 rope (diff {diff})"


def test_tied_and_untied_heads(hf_model_factory):
  tied_path, _ = hf_model_factory("qwen2", seed=len("qwen2_tied"), **CASES["qwen2_tied"][1])
  untied_path, untied_torch = hf_model_factory("qwen2", seed=len("qwen2_untied"),
                                               **CASES["qwen2_untied"][1])
  tied = cardjax.hf.from_pretrained(tied_path)
  untied = cardjax.hf.from_pretrained(untied_path)
  assert not hasattr(tied, "lm_head")
  np.testing.assert_array_equal(
      np.asarray(untied.lm_head.value), untied_torch.lm_head.weight.detach().numpy())
  # Different matrices, really: the test of the untied head is not a tied one in disguise.
  assert not np.array_equal(np.asarray(untied.lm_head.value), np.asarray(untied.embed.value))


@pytest.mark.parametrize("scan", [False, True], ids=["list", "scan"])
def test_packed_segments_equal_separate_documents(hf_model_factory, scan):
  """Two documents packed in one row (segment ids 1 and 2, positions restarting at 0) give
  the logits of running each document alone through transformers."""
  path, torch_model = hf_model_factory("qwen2", seed=len("qwen2_untied"),
                                       **CASES["qwen2_untied"][1])
  vocab = torch_model.config.vocab_size
  splits = [(7, 11), (12, 6)]  # per batch row: (len doc 1, len doc 2)
  seq = 18
  tokens = random_tokens(vocab, len(splits), seq, seed=3)
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
