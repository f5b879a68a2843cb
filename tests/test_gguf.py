"""cardjax.hf.from_gguf reads llama.cpp GGUF files exactly, and `cardjax import-gguf` turns
them into checkpoints that export back to Hugging Face folders.

The files are tiny random-init transformers models written as llama.cpp's converter writes
them (tests/gguf_helpers.py). The independent reference is transformers' own GGUF loader
(`from_pretrained(folder, gguf_file=...)`): same file, its own name map and un-permutation.
F32 files are also compared with the original torch model, which proves names and the
rotary permutation end to end without any GGUF reader in the loop.
"""

from __future__ import annotations

import json
import zlib

import numpy as np
import pytest

import cardjax.hf
from cardjax import checkpoint
from cardjax.cli import main
from cardjax.data.tokenizer import load_tokenizer
from cardjax.errors import CheckpointError
from cardjax.hf import gguf as g
from conftest import (PARITY_ATOL, build_hf_model, cardjax_logits, max_abs_diff, random_tokens,
                      torch_logits)
from gguf_helpers import (CHAT_TEMPLATE, encode, hf_to_gguf_tensors, model_meta, permute,
                          vocabulary, write_gguf, write_model)

TYPES = ("F32", "F16", "BF16", "Q8_0", "Q4_0", "Q4_1", "Q5_0", "Q5_1", "Q4_K", "Q6_K")
K_QUANTS = ("Q4_K", "Q6_K")  # random raw blocks: gguf's python package cannot quantize them
TOKENS = vocabulary()[0]
V = len(TOKENS)
COMMON = dict(vocab_size=V, num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2,
              rope_theta=100000.0, rms_norm_eps=1e-5, max_position_embeddings=64)
SMALL = dict(hidden_size=64, intermediate_size=128)  # rows a multiple of 32
WIDE = dict(hidden_size=256, intermediate_size=256)  # K-quant rows: a multiple of 256
FLOATS = ("F32", "F16", "BF16")
# case -> (architecture, tensor type of every 2-D weight, HF config). Float files are
# untied, quantized ones tied (as SmolLM2's Q4_1 release); one F32 file of each kind too.
CASES = {t: ("llama", t, dict(WIDE if t in K_QUANTS else SMALL,
                              tie_word_embeddings=t not in FLOATS)) for t in TYPES}
CASES["llama_tied_F32"] = ("llama", "F32", dict(SMALL, tie_word_embeddings=True))
# Qwen2: Q/K/V biases, and llama.cpp writes its Q and K unpermuted.
CASES["qwen2_F32"] = ("qwen2", "F32", dict(SMALL, tie_word_embeddings=False))
CASES["qwen2_Q8_0"] = ("qwen2", "Q8_0", dict(SMALL, tie_word_embeddings=True))
BATCH, SEQ = 3, 12
# Bound on the relative error (Frobenius) of a dequantized projection against the float
# weight it was quantized from, about twice the measured one (F16 2.1e-4, BF16 1.7e-3, Q8_0
# 5.5e-3, Q5_1 0.038, Q5_0 0.044, Q4_1 0.079, Q4_0 0.087). A projection left in llama.cpp's
# row order is off by ~1.4.
QUANT_REL_ERROR = {"F32": 0.0, "F16": 5e-4, "BF16": 4e-3, "Q8_0": 0.012, "Q5_0": 0.09,
                   "Q5_1": 0.08, "Q4_0": 0.17, "Q4_1": 0.16}


@pytest.fixture(scope="module")
def files(tmp_path_factory):
  """case -> (gguf path, torch model), each written once per module."""
  cache = {}

  def make(case):
    if case not in cache:
      arch, qtype, config = CASES[case]
      seed = zlib.crc32(case.encode()) % 10_000
      torch_model = build_hf_model(arch, seed=seed, **COMMON, **config)
      folder = tmp_path_factory.mktemp(f"gguf_{case}")
      cache[case] = (write_model(folder / f"{case}.gguf", torch_model, arch, qtype, seed=seed),
                     torch_model)
    return cache[case]

  return make


def transformers_gguf(path):
  """transformers' own GGUF import of `path`, fp32."""
  import torch
  from transformers import AutoModelForCausalLM

  return AutoModelForCausalLM.from_pretrained(str(path.parent), gguf_file=path.name,
                                              dtype=torch.float32,
                                              attn_implementation="eager").eval()


def _tokens(seed=7):
  return random_tokens(V, BATCH, SEQ, seed=seed)


# --- parity ---------------------------------------------------------------------------------


@pytest.mark.parametrize("case", list(CASES))
def test_logits_match_transformers_gguf(files, case):
  path, torch_model = files(case)
  arch, qtype, config = CASES[case]
  f = g.GGUFFile(path)
  # Every type is exercised on Q and K, so the un-permutation is checked under it.
  for name in ("blk.0.attn_q.weight", "blk.1.attn_k.weight", "token_embd.weight"):
    assert f.type_name(name) == qtype, name
  assert f.type_name("blk.0.attn_norm.weight") == "F32"

  model = cardjax.hf.from_gguf(path)
  cfg, hc = model.cfg, torch_model.config
  assert cfg.model_type == arch
  assert (cfg.vocab_size, cfg.hidden_size, cfg.intermediate_size, cfg.num_layers) == (
      V, hc.hidden_size, hc.intermediate_size, 2)
  assert (cfg.num_heads, cfg.num_kv_heads, cfg.resolved_head_dim) == (4, 2, hc.hidden_size // 4)
  assert (cfg.rope_theta, cfg.rms_norm_eps) == (100000.0, pytest.approx(1e-5))
  assert cfg.tie_word_embeddings == config["tie_word_embeddings"]
  assert cfg.qkv_bias == (arch == "qwen2")
  assert (cfg.bos_token_id, cfg.eos_token_id, cfg.pad_token_id) == (1, 2, 2)
  assert cfg.mask_token_id == 4  # <empty_output>, the last unused control token

  tokens = _tokens()
  got = cardjax_logits(model, tokens, jit=True)
  ref_model = transformers_gguf(path)
  assert type(ref_model).__name__ == type(torch_model).__name__
  expected = torch_logits(ref_model, tokens)
  assert np.std(expected) > 0.3, np.std(expected)  # not two near-zero tensors
  diff = max_abs_diff(got, expected)
  assert diff < PARITY_ATOL, f"{case}: max |ours - transformers(gguf)| = {diff}"
  if qtype == "F32":
    diff = max_abs_diff(got, torch_logits(torch_model, tokens))
    assert diff < PARITY_ATOL, f"{case}: max |ours - original torch model| = {diff}"


@pytest.mark.parametrize("case", [c for c in CASES if CASES[c][1] not in K_QUANTS])
def test_projections_equal_the_original_weights(files, case):
  """Without transformers: the dequantized, un-permuted Q/K/V projections are the original
  float weights up to the type's rounding error (a permuted one is off by ~1.4)."""
  path, torch_model = files(case)
  qtype = CASES[case][1]
  ours = dict(cardjax.hf.hf_tensors(cardjax.hf.from_gguf(path)))
  state = torch_model.state_dict()
  for layer in (0, 1):
    for proj in ("q_proj", "k_proj", "v_proj"):
      name = f"model.layers.{layer}.self_attn.{proj}.weight"
      want = state[name].numpy()
      err = np.linalg.norm(ours[name] - want) / np.linalg.norm(want)
      assert err <= QUANT_REL_ERROR[qtype], f"{name}: relative error {err}"
  if CASES[case][0] == "qwen2":  # biases stay F32, unpermuted
    np.testing.assert_array_equal(ours["model.layers.1.self_attn.k_proj.bias"],
                                  state["model.layers.1.self_attn.k_proj.bias"].numpy())


def test_unpermutation_is_what_makes_llama_files_match(files, monkeypatch):
  """The parity above is sensitive to the permutation: skipping it changes the logits."""
  path, torch_model = files("Q4_0")
  expected = torch_logits(transformers_gguf(path), _tokens())
  monkeypatch.setattr(g, "unpermute", lambda w, heads: w)
  wrong = cardjax_logits(cardjax.hf.from_gguf(path), _tokens(), jit=True)
  assert max_abs_diff(wrong, expected) > 0.1


# --- unpermute ------------------------------------------------------------------------------


def test_unpermute_small_example():
  # One head of 4 rows: HF rotates the halves (r0, r2) and (r1, r3); llama.cpp stores the
  # pairs adjacent, [r0, r2, r1, r3].
  np.testing.assert_array_equal(permute(np.arange(4), 1), [0, 2, 1, 3])
  np.testing.assert_array_equal(g.unpermute(np.array([0, 2, 1, 3]), 1), np.arange(4))


@pytest.mark.parametrize("heads,head_dim", [(1, 2), (1, 8), (2, 4), (3, 16), (4, 16), (8, 64)])
def test_unpermute_inverts_llama_cpp(heads, head_dim):
  from transformers.modeling_gguf_pytorch_utils import LlamaTensorProcessor

  rng = np.random.default_rng(heads * 100 + head_dim)
  for x in (rng.standard_normal((heads * head_dim, 5)).astype(np.float32),
            rng.standard_normal(heads * head_dim).astype(np.float32)):
    p = permute(x, heads)
    if head_dim > 2:
      assert not np.array_equal(p, x)
    np.testing.assert_array_equal(g.unpermute(p, heads), x)
    # transformers' inverse of the same permutation agrees.
    np.testing.assert_array_equal(
        LlamaTensorProcessor()._reverse_permute_weights(p, heads, heads), x)


# --- tokenizer ------------------------------------------------------------------------------

META = dict(block_count=2, context_length=64, embedding_length=64, feed_forward_length=128,
            head_count=4, head_count_kv=2, rope_freq_base=10000.0, rms_eps=1e-5,
            rope_dimension_count=16)


def _meta_file(path, **kwargs):
  """A GGUF file with the tokenizer metadata and no tensors (enough for write_tokenizer)."""
  return g.GGUFFile(write_gguf(path, "llama", META, {}, **kwargs))


@pytest.fixture(scope="module")
def tokenizer_folder(tmp_path_factory):
  d = tmp_path_factory.mktemp("gguf_tok")
  f = _meta_file(d / "tok.gguf")
  return f, g.write_tokenizer(f, d / "tokenizer")


def test_tokenizer_splits_digits_one_by_one(tokenizer_folder, tmp_path):
  f, folder = tokenizer_folder
  tok = load_tokenizer(folder)
  assert tok.encode("12345") == [TOKENS.index(c) for c in "12345"]
  # The merges "1 2", "12 3" exist: GPT-2's own split would use them, so the per-digit
  # split of tokenizer.ggml.pre = "smollm" is what keeps the digits apart.
  plain = g.write_tokenizer(_meta_file(tmp_path / "gpt2.gguf", pre="gpt2"), tmp_path / "t")
  assert load_tokenizer(plain).encode("12345") == [TOKENS.index(t) for t in ("123", "4", "5")]


@pytest.mark.parametrize("text", ["Hello, the world!  In 2024: 12345 apples.",
                                  "na\u00efve caf\u00e9 \u2014 \u65e5\u672c\u8a9e\n\n\ttabs ",
                                  "<|im_start|>user\nthe inn<|im_end|>\n"])
def test_tokenizer_round_trips(tokenizer_folder, text):
  tok = load_tokenizer(tokenizer_folder[1])
  assert tok.decode(tok.encode(text)) == text


def test_tokenizer_merges_and_control_tokens(tokenizer_folder):
  tok = load_tokenizer(tokenizer_folder[1])
  assert tok.encode(" the") == [TOKENS.index("Ġthe")]
  ids = tok.encode("<|im_start|>user\nhi<|im_end|><empty_output>")
  pieces = ["u", "s", "er", "Ċ", "h", "i"]  # "Ċ" is the byte-level "\n"
  assert ids == [1] + [TOKENS.index(p) for p in pieces] + [2, 4]


def test_tokenizer_config(tokenizer_folder):
  f, folder = tokenizer_folder
  config = json.loads((folder / "tokenizer_config.json").read_text())
  assert config["chat_template"] == CHAT_TEMPLATE
  assert config["mask_token"] == "<empty_output>"
  assert (config["bos_token"], config["eos_token"], config["pad_token"], config["unk_token"]) == (
      "<|im_start|>", "<|im_end|>", "<|im_end|>", "<|endoftext|>")
  tok = load_tokenizer(folder)
  assert tok.mask_id == g.mask_token(f)[1] == 4
  assert (tok.eos_id, tok.pad_id, tok.vocab_size) == (2, 2, V)
  assert tok.render_chat([{"role": "user", "content": "hi"}], add_generation_prompt=True) == (
      "<|im_start|>system\nYou are a tiny model<|im_end|>\n<|im_start|>user\nhi<|im_end|>\n"
      "<|im_start|>assistant\n")


@pytest.mark.parametrize("kwargs,requested,want", [
    ({}, None, ("<empty_output>", 4)),
    # <|mask|> wins although it is not the last control token.
    (dict(vocab=vocabulary(("<|mask|>", "<zzz>"))), None, ("<|mask|>", 5)),
    # The chat template uses <empty_output>, so the one before it.
    (dict(chat_template=CHAT_TEMPLATE + "<empty_output>"), None, ("<repo_name>", 3)),
    (dict(token_ids={"pad": 4}), None, ("<repo_name>", 3)),
    ({}, "<repo_name>", ("<repo_name>", 3)),
], ids=["last_unused_control", "mask_token", "template_uses_it", "pad_uses_it", "requested"])
def test_mask_token_choice(tmp_path, kwargs, requested, want):
  f = _meta_file(tmp_path / "m.gguf", **kwargs)
  assert g.mask_token(f, requested) == want
  folder = g.write_tokenizer(f, tmp_path / "tok", mask=requested)
  assert load_tokenizer(folder).mask_id == want[1]


def test_mask_token_errors(tmp_path):
  f = _meta_file(tmp_path / "m.gguf")
  with pytest.raises(CheckpointError, match="'<nope>' is not in the vocabulary"):
    g.mask_token(f, "<nope>")
  with pytest.raises(CheckpointError, match="<nope>"):
    g.write_tokenizer(f, tmp_path / "tok", mask="<nope>")
  assert not (tmp_path / "tok").exists()
  busy = _meta_file(tmp_path / "busy.gguf",
                    chat_template=CHAT_TEMPLATE + "<repo_name><empty_output>")
  with pytest.raises(CheckpointError, match="--mask-token"):
    g.mask_token(busy)


@pytest.mark.parametrize("kwargs,match", [
    (dict(pre="tekken"), "tokenizer.ggml.pre='tekken'"),
])
def test_unknown_pre_tokenizer(tmp_path, kwargs, match):
  f = _meta_file(tmp_path / "m.gguf", **kwargs)
  with pytest.raises(CheckpointError, match=match):
    g.write_tokenizer(f, tmp_path / "tok")
  assert not (tmp_path / "tok").exists()


# --- CLI: import-gguf, restore, export-hf ---------------------------------------------------


@pytest.fixture(scope="module")
def imported(files, tmp_path_factory):
  """The tied Q4_1 file (SmolLM2's release type) imported with the CLI."""
  path, _ = files("Q4_1")
  ckpt = tmp_path_factory.mktemp("gguf_cli") / "ckpt"
  assert main(["import-gguf", str(path), str(ckpt)]) == 0
  return path, ckpt


def test_import_gguf_writes_a_checkpoint(imported):
  path, ckpt = imported
  assets = ckpt / checkpoint.ASSETS
  assert (assets / "tokenizer.json").is_file() and (assets / "tokenizer_config.json").is_file()
  model, step = checkpoint.restore_model(ckpt)
  assert step == 0 and model.cfg.mask_token_id == 4 and model.cfg.tie_word_embeddings
  direct = cardjax.hf.from_gguf(path)
  assert model.cfg == direct.cfg
  np.testing.assert_array_equal(cardjax_logits(model, _tokens(), jit=True),
                                cardjax_logits(direct, _tokens(), jit=True))
  tok = checkpoint.load_tokenizer(ckpt, model.cfg)
  assert tok.mask_id == 4 and tok.encode("12345") == [TOKENS.index(c) for c in "12345"]


def test_export_hf_loads_in_transformers(imported, tmp_path):
  import torch
  from transformers import AutoModelForCausalLM, AutoTokenizer

  path, ckpt = imported
  out = tmp_path / "hf"
  assert main(["export-hf", str(ckpt), str(out)]) == 0
  config = json.loads((out / "config.json").read_text())
  assert config["model_type"] == "llama" and config["mask_token_id"] == 4
  hf_model = AutoModelForCausalLM.from_pretrained(str(out), dtype=torch.float32,
                                                  attn_implementation="eager").eval()
  expected = cardjax_logits(cardjax.hf.from_gguf(path), _tokens(), jit=True)
  assert max_abs_diff(torch_logits(hf_model, _tokens()), expected) < PARITY_ATOL

  ours = checkpoint.load_tokenizer(ckpt, checkpoint.read_model_config(ckpt))
  theirs = AutoTokenizer.from_pretrained(str(out))
  chat = ours.render_chat([{"role": "user", "content": "What is 12345 + 678?"}],
                          add_generation_prompt=True)
  assert theirs.apply_chat_template([{"role": "user", "content": "What is 12345 + 678?"}],
                                    add_generation_prompt=True, tokenize=False) == chat
  for text in ("12345", chat, " the inn 2024"):
    assert theirs.encode(text, add_special_tokens=False) == ours.encode(text), text
  assert theirs.mask_token == "<empty_output>" and theirs.mask_token_id == 4


# --- errors ---------------------------------------------------------------------------------


def _bad_file(tmp_path, files, kind):
  """(path, text the error must contain) of one broken input."""
  import gguf

  path, torch_model = files("F32")
  small = lambda **kw: write_model(tmp_path / f"{kind}.gguf", torch_model, "llama", **kw)
  if kind == "missing":
    return tmp_path / "nope.gguf", "does not exist"
  if kind == "text":
    (tmp_path / "model.gguf").write_text("this is not a model\n")
    return tmp_path / "model.gguf", "is not a GGUF file"
  if kind == "truncated":
    data = path.read_bytes()
    (tmp_path / "half.gguf").write_bytes(data[:len(data) // 2])
    return tmp_path / "half.gguf", "is not a complete GGUF file"
  if kind == "iq4_nl":
    # 18-byte blocks of 32 weights (fp16 scale + 16 bytes of 4-bit indices).
    raw = np.random.default_rng(0).integers(0, 256, (128, 2 * 18), dtype=np.uint8)
    return small(add={"blk.0.ffn_up.weight": (raw, gguf.GGMLQuantizationType.IQ4_NL)}), (
        "blk.0.ffn_up.weight (and 0 more) has type IQ4_NL")
  if kind == "architecture":
    tensors = {"token_embd.weight": encode(np.zeros((V, 64), np.float32), "F32")}
    return write_gguf(tmp_path / "phi3.gguf", "phi3", model_meta(torch_model), tensors), (
        "general.architecture='phi3' is not implemented")
  if kind == "unknown_tensor":
    return small(add={"blk.0.attn_q_norm.weight": encode(np.ones(16, np.float32), "F32")}), (
        "blk.0.attn_q_norm.weight")
  if kind == "odd_tensor_name":  # no "blk.{i}.{name}" structure at all
    return small(add={"blk.extra": encode(np.ones(16, np.float32), "F32")}), "blk.extra"
  if kind == "rope_freqs":
    return small(add={"rope_freqs.weight": encode(np.ones(8, np.float32), "F32")}), (
        "rope_freqs.weight")
  if kind == "missing_tensor":
    return small(drop=("blk.1.ffn_up.weight",)), "'model.layers.1.mlp.up_proj.weight'"
  if kind == "wrong_shape":
    meta = dict(model_meta(torch_model), feed_forward_length=96)
    tensors = {n: encode(a, "F32") for n, a in hf_to_gguf_tensors(torch_model, "llama").items()}
    return write_gguf(tmp_path / "shape.gguf", "llama", meta, tensors), "wrong shape"
  if kind == "qwen2_without_biases":
    tensors = {"token_embd.weight": encode(np.zeros((V, 64), np.float32), "F32")}
    return write_gguf(tmp_path / "qwen2.gguf", "qwen2", model_meta(torch_model), tensors), (
        "has Q/K/V biases")
  raise AssertionError(kind)


ERRORS = ("missing", "text", "truncated", "iq4_nl", "architecture", "unknown_tensor",
          "odd_tensor_name", "rope_freqs", "missing_tensor", "wrong_shape", "qwen2_without_biases")


@pytest.mark.parametrize("kind", ERRORS)
def test_bad_file_is_one_clear_error(files, tmp_path, capsys, kind):
  path, text = _bad_file(tmp_path, files, kind)
  with pytest.raises(CheckpointError) as info:
    cardjax.hf.from_gguf(path)
  assert text in str(info.value) and str(path) in str(info.value)

  ckpt = tmp_path / "ckpt"
  capsys.readouterr()
  assert main(["import-gguf", str(path), str(ckpt)]) == 2
  err = capsys.readouterr().err
  assert err.startswith("cardjax: error: ") and text in err and len(err.splitlines()) == 1
  assert not ckpt.exists()  # nothing half-written


def test_mask_token_flag_not_in_vocab(files, tmp_path, capsys):
  path, _ = files("Q8_0")
  ckpt = tmp_path / "ckpt"
  assert main(["import-gguf", str(path), str(ckpt), "--mask-token", "<|mask|>"]) == 2
  assert "'<|mask|>' is not in the vocabulary" in capsys.readouterr().err
  assert not ckpt.exists()
