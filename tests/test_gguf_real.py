"""The real SmolLM2-135M-Instruct Q4_1 GGUF: cardjax's import computes what transformers'
import of the same file computes, token for token (slow: `make test-slow`).

The file is found at $CARDJAX_SMOLLM2_GGUF, default runs/smollm2/SmolLM2-135M-Instruct.Q4_1.gguf
(`make smollm2` fetches it); the test skips without it.
"""

from __future__ import annotations

import os
from pathlib import Path

import numpy as np
import pytest

import cardjax.hf
from cardjax.data.tokenizer import load_tokenizer
from cardjax.decoding import generate
from cardjax.hf import gguf as g
from conftest import cardjax_logits, torch_logits

pytestmark = pytest.mark.slow

ROOT = Path(__file__).resolve().parents[1]
GGUF = Path(os.environ.get("CARDJAX_SMOLLM2_GGUF",
                           ROOT / "runs/smollm2/SmolLM2-135M-Instruct.Q4_1.gguf"))
QUESTIONS = ("What is the capital of France?", "Write a haiku about the sea.",
             "How many legs does a spider have?", "Explain photosynthesis in one sentence.",
             "What is 12 + 35?")
NEW_TOKENS = 64


@pytest.fixture(scope="module")
def path():
  if not GGUF.is_file():
    pytest.skip(f"{GGUF} is absent: `make smollm2` fetches it (or set CARDJAX_SMOLLM2_GGUF)")
  return GGUF


@pytest.fixture(scope="module")
def ours(path, tmp_path_factory):
  """(cardjax model, the tokenizer rebuilt from the file's metadata)."""
  folder = g.write_tokenizer(g.GGUFFile(path), tmp_path_factory.mktemp("smollm2_tok"))
  return cardjax.hf.from_gguf(path), load_tokenizer(folder)


@pytest.fixture(scope="module")
def theirs(path):
  import torch
  from transformers import AutoModelForCausalLM

  model = AutoModelForCausalLM.from_pretrained(str(path.parent), gguf_file=path.name,
                                               dtype=torch.float32).eval()
  model.generation_config.eos_token_id = None  # both sides run all NEW_TOKENS steps
  return model


@pytest.fixture(scope="module")
def prompts(ours):
  _, tok = ours
  return [tok.encode(tok.render_chat([{"role": "user", "content": q}],
                                     add_generation_prompt=True)) for q in QUESTIONS]


def test_logits_match_transformers(ours, theirs, prompts):
  model, tok = ours
  # One right-padded batch: causal attention keeps the padding out of every real position.
  width = max(len(p) for p in prompts)
  tokens = np.full((len(prompts), width), tok.pad_id, np.int32)
  for i, p in enumerate(prompts):
    tokens[i, :len(p)] = p
  got = cardjax_logits(model, tokens, jit=True)
  expected = torch_logits(theirs, tokens)
  valid = np.arange(width)[None, :] < np.array([len(p) for p in prompts])[:, None]
  got, expected = got[valid], expected[valid]
  diff = float(np.max(np.abs(got - expected)))
  scale = float(np.max(np.abs(expected)))
  print(f"SmolLM2 Q4_1: max |ours - transformers| = {diff:.3g} over logits up to {scale:.3g}")
  # fp32 on both sides, but 30 layers summed in different orders (XLA vs torch kernels):
  # ~1e-4 absolute on logits of magnitude ~20 is accumulation-order noise (1.39e-4 measured
  # when this test was written), so the bound is relative to the logit scale.
  np.testing.assert_allclose(got, expected, rtol=1e-5, atol=2e-4)
  assert diff / scale < 1e-5


def test_greedy_generation_matches_transformers(ours, theirs, prompts):
  import torch

  model, _ = ours
  for prompt in prompts:
    mine = generate(model, [prompt], NEW_TOKENS).rows()[0]  # no stop ids: all 64 tokens
    with torch.no_grad():
      out = theirs.generate(torch.tensor([prompt]), attention_mask=torch.ones(1, len(prompt),
                                                                              dtype=torch.long),
                            do_sample=False, max_new_tokens=NEW_TOKENS,
                            pad_token_id=2)  # <|im_end|>; unused (one row), stops a warning
    ref = out[0, len(prompt):].tolist()
    assert len(mine) == len(ref) == NEW_TOKENS
    assert mine == ref


def test_knows_the_capital_of_france(ours, prompts):
  model, tok = ours
  out = generate(model, [prompts[0]], NEW_TOKENS, stop_ids=tok.stop_ids, pad_id=tok.pad_id)
  answer = tok.decode(out.rows()[0], skip_special=True)
  assert "Paris" in answer, answer


def test_the_recipe_describes_the_imported_model(ours):
  """configs/smollm2_135m.py's model section is what import-gguf reads from the file, so
  its tokenizer and [MASK] checks pass and a stage restores the import."""
  from cardjax.config import load_config, model_config

  model, _ = ours
  for stage in ("sft", "mars"):
    cfg = model_config(load_config(f"configs/smollm2_135m.py:{stage}"))
    assert cfg == model.cfg, stage
