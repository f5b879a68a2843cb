"""`cardjax import-hf` reads the released MARS checkpoint layout: a Qwen2 model saved with
model_type "a2d-qwen2" whose [MASK] id is recorded only by the tokenizer (`<|mask|>` added
as a special token at the first id past the vocabulary, inside the padded embedding)."""

from __future__ import annotations

import json
import logging
import shutil

import jax
import numpy as np
import pytest
from flax import nnx

from cardjax import checkpoint
from cardjax.cli import main
from cardjax.errors import CheckpointError
from cardjax.hf.mask import tokenizer_mask
from conftest import PARITY_ATOL, build_hf_model, cardjax_logits, max_abs_diff, torch_logits

SPECIALS = ("<|endoftext|>", "<|im_start|>", "<|im_end|>")  # Qwen's, in its order
MERGES = [("Ġ", "t"), ("h", "e"), ("Ġt", "he"), ("Ġ", "c"), ("a", "t"), ("Ġc", "at")]
BASE = 256 + len(MERGES) + len(SPECIALS)  # byte symbols, merges, specials
MASK_ID = BASE  # <|mask|>: the first id past the tokenizer's vocabulary (151665 for Qwen2.5)
VOCAB = 320  # the embedding is padded past it, as Qwen2.5's (151936 rows)
TOKENS = [[1, 71, 72, 73, 267, 268, 5, 9], [2, 100, 101, 264, 265, 266, 260, 3]]


def _tokenizer(add_mask: bool = True):
  """A byte-level BPE wrapped and saved as MARS's get_tokenizer leaves it."""
  from tokenizers import Tokenizer, decoders, models, pre_tokenizers
  from transformers import PreTrainedTokenizerFast

  alphabet = sorted(pre_tokenizers.ByteLevel.alphabet())
  vocab = {t: i for i, t in enumerate(alphabet + ["".join(m) for m in MERGES])}
  tok = Tokenizer(models.BPE(vocab=vocab, merges=MERGES))
  tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
  tok.decoder = decoders.ByteLevel()
  tok.add_special_tokens(list(SPECIALS))
  fast = PreTrainedTokenizerFast(tokenizer_object=tok, eos_token="<|im_end|>",
                                 pad_token="<|endoftext|>")
  assert len(fast) == BASE and fast.eos_token_id == BASE - 1
  if add_mask:  # dllm/utils/models.py get_tokenizer, for A2DQwen2LMHeadModel
    fast.add_special_tokens({"mask_token": "<|mask|>"})
    assert fast.mask_token_id == MASK_ID
  return fast


@pytest.fixture(scope="module")
def a2d(tmp_path_factory):
  """(folder, torch model): a random Qwen2 saved as a released MARS checkpoint."""
  model = build_hf_model("qwen2", seed=77, vocab_size=VOCAB, tie_word_embeddings=True)
  folder = tmp_path_factory.mktemp("a2d") / "mars-qwen2"
  model.save_pretrained(str(folder))
  config = json.loads((folder / "config.json").read_text())
  config.update(model_type="a2d-qwen2", architectures=["A2DQwen2LMHeadModel"])
  assert "mask_token_id" not in config
  (folder / "config.json").write_text(json.dumps(config, indent=2))
  _tokenizer().save_pretrained(str(folder))
  return folder, model


@pytest.fixture(scope="module")
def imported(a2d, tmp_path_factory):
  folder, _ = a2d
  ckpt = tmp_path_factory.mktemp("a2d_ck") / "ck"
  assert main(["import-hf", str(folder), str(ckpt)]) == 0
  return ckpt


def _params(model):
  flat = jax.tree_util.tree_flatten_with_path(
      nnx.state(model, nnx.Param), is_leaf=lambda x: isinstance(x, nnx.Variable))[0]
  return {jax.tree_util.keystr(p): np.asarray(v.get_value()) for p, v in flat}


def test_tokenizer_records_the_mask(a2d):
  folder, _ = a2d
  added = json.loads((folder / "tokenizer.json").read_text())["added_tokens"]
  assert {"content": "<|mask|>", "id": MASK_ID} in [
      {k: a[k] for k in ("content", "id")} for a in added]
  assert tokenizer_mask(folder) == ("<|mask|>", MASK_ID)


def test_import_reads_a2d_qwen2_and_the_tokenizer_mask(a2d, tmp_path, caplog):
  folder, torch_model = a2d
  with caplog.at_level(logging.INFO, logger="cardjax.hf"):
    assert main(["import-hf", str(folder), str(tmp_path / "ck")]) == 0
  assert "model_type 'a2d-qwen2' is read as 'qwen2'" in caplog.text
  assert f"[MASK] = '<|mask|>' (id {MASK_ID})" in caplog.text
  model, _ = checkpoint.restore_model(tmp_path / "ck")
  assert model.cfg.model_type == "qwen2" and model.cfg.mask_token_id == MASK_ID
  assert model.cfg.vocab_size == VOCAB and model.cfg.qkv_bias
  # The A2D class only swaps Qwen2's causal mask; a causal forward is Qwen2ForCausalLM's.
  expected = torch_logits(torch_model, TOKENS)
  assert np.std(expected) > 0.3
  assert max_abs_diff(cardjax_logits(model, TOKENS), expected) < PARITY_ATOL


def test_export_is_qwen2_and_round_trips(a2d, imported, tmp_path):
  import torch
  from transformers import AutoModelForCausalLM, AutoTokenizer

  _, torch_model = a2d
  out = tmp_path / "export"
  assert main(["export-hf", str(imported), str(out)]) == 0
  config = json.loads((out / "config.json").read_text())
  assert config["model_type"] == "qwen2" and config["architectures"] == ["Qwen2ForCausalLM"]
  assert config["mask_token_id"] == MASK_ID
  hf_model = AutoModelForCausalLM.from_pretrained(str(out), dtype=torch.float32,
                                                  attn_implementation="eager").eval()
  assert max_abs_diff(torch_logits(hf_model, TOKENS), torch_logits(torch_model, TOKENS)) < 1e-5
  assert AutoTokenizer.from_pretrained(str(out)).mask_token_id == MASK_ID

  assert main(["import-hf", str(out), str(tmp_path / "again")]) == 0
  first, _ = checkpoint.restore_model(imported)
  again, _ = checkpoint.restore_model(tmp_path / "again")
  assert again.cfg == first.cfg
  a, b = _params(first), _params(again)
  assert sorted(a) == sorted(b)
  for key in a:
    np.testing.assert_array_equal(a[key], b[key], err_msg=key)


def test_mask_token_id_flag_overrides(a2d, tmp_path):
  folder, _ = a2d
  assert main(["import-hf", str(folder), str(tmp_path / "ck"), "--mask-token-id", "300"]) == 0
  assert checkpoint.read_model_config(tmp_path / "ck").mask_token_id == 300


def test_folder_without_a_mask_token(a2d, tmp_path):
  folder, _ = a2d
  plain = shutil.copytree(folder, tmp_path / "plain")
  for name in ("tokenizer.json", "tokenizer_config.json", "chat_template.jinja"):
    (plain / name).unlink(missing_ok=True)
  _tokenizer(add_mask=False).save_pretrained(str(plain))
  assert tokenizer_mask(plain) is None
  assert main(["import-hf", str(plain), str(tmp_path / "ck")]) == 0
  assert checkpoint.read_model_config(tmp_path / "ck").mask_token_id == -1
  bare = shutil.copytree(folder, tmp_path / "bare",
                         ignore=shutil.ignore_patterns("tokenizer*", "special_tokens_map.json"))
  assert tokenizer_mask(bare) is None
  assert main(["import-hf", str(bare), str(tmp_path / "ck2")]) == 0
  assert checkpoint.read_model_config(tmp_path / "ck2").mask_token_id == -1


def test_mask_lookup_sources(a2d, tmp_path):
  folder, _ = a2d
  config = json.loads((folder / "tokenizer_config.json").read_text())
  assert config["mask_token"] == "<|mask|>"
  # tokenizer.json alone: <|mask|> among its added tokens.
  only_json = tmp_path / "json"
  only_json.mkdir()
  shutil.copy(folder / "tokenizer.json", only_json)
  assert tokenizer_mask(only_json) == ("<|mask|>", MASK_ID)
  # tokenizer_config.json alone, as transformers 4 (MARS's) writes it: its mask_token,
  # found in added_tokens_decoder (transformers 5 no longer writes that table).
  only_config = tmp_path / "config"
  only_config.mkdir()
  decoder = {str(MASK_ID): {"content": "<|mask|>", "lstrip": False, "normalized": False,
                            "rstrip": False, "single_word": False, "special": True}}
  (only_config / "tokenizer_config.json").write_text(json.dumps(
      {"added_tokens_decoder": decoder, "mask_token": "<|mask|>"}))
  assert tokenizer_mask(only_config) == ("<|mask|>", MASK_ID)
  # ... and without the mask_token entry, <|mask|> is still found there.
  (only_config / "tokenizer_config.json").write_text(json.dumps(
      {"added_tokens_decoder": decoder}))
  assert tokenizer_mask(only_config) == ("<|mask|>", MASK_ID)
  # A mask_token the tokenizer lacks is a broken folder, said at import time.
  broken = tmp_path / "broken"
  broken.mkdir()
  (broken / "tokenizer_config.json").write_text(json.dumps({"mask_token": "<mask>"}))
  with pytest.raises(CheckpointError, match="names mask_token '<mask>'.*--mask-token-id"):
    tokenizer_mask(broken)


def test_mask_past_the_embedding_is_an_error(a2d, tmp_path, capsys):
  folder, _ = a2d
  small = shutil.copytree(folder, tmp_path / "small")
  config = json.loads((small / "config.json").read_text())
  config["vocab_size"] = MASK_ID  # an unpadded embedding: no row for <|mask|>
  (small / "config.json").write_text(json.dumps(config))
  assert main(["import-hf", str(small), str(tmp_path / "ck")]) == 2
  err = capsys.readouterr().err
  assert f"<|mask|> at id {MASK_ID}, outside the model's vocab_size={MASK_ID}" in err
  assert "--mask-token-id" in err
  assert not (tmp_path / "ck").exists()


def test_generate_mars_on_the_import(imported, capsys):
  # --block given: the default is being changed elsewhere. tau = 1 accepts only what AR
  # greedy would write, so MARS prints AR's text.
  args = ["generate", "--checkpoint", str(imported), "--prompt", "the cat",
          "--max-new-tokens", "6", "--block", "4"]
  capsys.readouterr()
  assert main(args) == 0
  ar_out = capsys.readouterr().out
  assert main(args + ["--method", "mars", "--objective", "mars", "--tau", "1.0"]) == 0
  mars_out = capsys.readouterr().out
  assert "method mars B=4" in mars_out and "tokens per forward" in mars_out
  assert mars_out.split("\n")[1] == ar_out.split("\n")[1]
