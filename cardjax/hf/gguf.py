"""llama.cpp GGUF files -> a cardjax Decoder and a Hugging Face tokenizer folder.

The file is read with the `gguf` package (llama.cpp's own reader and dequantizers), so a
quantized file loads as fp32 weights: the import is exact with respect to what llama.cpp
computes from the same bits. Three things differ from a HF folder and are undone here:
- names: llama.cpp's `blk.{i}.attn_q.weight` etc. map onto the HF names that
  cardjax/hf/weights.py already knows, so the rest of the loader is shared;
- the rotary layout: llama.cpp's converter permutes the rows of a *llama* model's Q and K
  projections (per head, [2, d/2] -> [d/2, 2]) so that its rope rotates adjacent pairs; HF
  rotates halves. `unpermute` is the inverse. Qwen2 and Qwen3 files are written unpermuted
  (Qwen3's per-head q/k norm weights, `attn_q_norm`/`attn_k_norm`, too);
- the tokenizer: the vocabulary, merges, token types and chat template live in the metadata;
  `write_tokenizer` rebuilds a `tokenizer.json` whose pre-tokenizer follows the file's
  `tokenizer.ggml.pre` (SmolLM2's splits every digit, as its original tokenizer does).
Every check runs before anything is written: a bad file leaves nothing half-written.
"""

from __future__ import annotations

import json
import logging
from pathlib import Path

import numpy as np

from cardjax.errors import CheckpointError

log = logging.getLogger("cardjax.hf")

MAGIC = b"GGUF"
ARCHITECTURES = ("llama", "qwen2", "qwen3")
# Tensor types read (each tested on files written with gguf's writer).
SUPPORTED_TYPES = ("F32", "F16", "BF16", "Q8_0", "Q4_0", "Q4_1", "Q5_0", "Q5_1", "Q4_K",
                   "Q6_K")
# llama.cpp name inside "blk.{i}." -> HF name inside "model.layers.{i}.".
LAYER_NAMES = {
    "attn_norm.weight": "input_layernorm.weight",
    "attn_q.weight": "self_attn.q_proj.weight",
    "attn_k.weight": "self_attn.k_proj.weight",
    "attn_v.weight": "self_attn.v_proj.weight",
    "attn_output.weight": "self_attn.o_proj.weight",
    "attn_q.bias": "self_attn.q_proj.bias",
    "attn_k.bias": "self_attn.k_proj.bias",
    "attn_v.bias": "self_attn.v_proj.bias",
    "attn_output.bias": "self_attn.o_proj.bias",
    "attn_q_norm.weight": "self_attn.q_norm.weight",
    "attn_k_norm.weight": "self_attn.k_norm.weight",
    "ffn_norm.weight": "post_attention_layernorm.weight",
    "ffn_gate.weight": "mlp.gate_proj.weight",
    "ffn_up.weight": "mlp.up_proj.weight",
    "ffn_down.weight": "mlp.down_proj.weight",
}
# Qwen3's per-head q/k norm weights: in another architecture's file they belong to no
# decoder cardjax implements (the config would not build them).
QK_NORM_NAMES = ("attn_q_norm.weight", "attn_k_norm.weight")
TOP_NAMES = {
    "token_embd.weight": "model.embed_tokens.weight",
    "output_norm.weight": "model.norm.weight",
    "output.weight": "lm_head.weight",
}
# tokenizer.ggml.token_type values (llama.cpp's enum).
CONTROL, USER_DEFINED = 3, 4
# GPT-2's split, which llama.cpp applies after its per-digit split for these vocabularies.
DIGIT_SPLIT_PRE = ("smollm", "starcoder", "refact", "codeshell", "command-r", "exaone")
PLAIN_PRE = ("gpt2", "default", "gpt-2", "")
QWEN2_PRE = ("qwen2", "deepseek-r1-qwen")
LLAMA3_PRE = ("llama3", "llama-bpe", "llama-v3", "smaug-bpe")
LLAMA3_SPLIT = (r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}"
                r"| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+")


class GGUFFile:
  """The metadata and tensor table of one GGUF file (tensor data stays memory-mapped)."""

  def __init__(self, path: str | Path):
    import gguf

    self.path = Path(path)
    if not self.path.is_file():
      raise CheckpointError(f"{self.path} does not exist or is not a file; pass a .gguf file "
                            "(make smollm2 fetches SmolLM2-135M-Instruct)")
    with open(self.path, "rb") as f:
      head = f.read(4)
    if head != MAGIC:
      raise CheckpointError(f"{self.path} is not a GGUF file (it starts with {head!r}, not "
                            f"{MAGIC!r}); for a Hugging Face folder use import-hf")
    try:
      reader = gguf.GGUFReader(str(self.path))
      self.tensors = {t.name: t for t in reader.tensors}
      for t in reader.tensors:  # a truncated file has tensors that end past its size
        if t.data.nbytes != t.n_bytes:
          raise ValueError(f"tensor {t.name} has {t.data.nbytes} of {t.n_bytes} bytes")
    except (ValueError, IndexError, OverflowError, KeyError, EOFError) as e:
      raise CheckpointError(f"{self.path} is not a complete GGUF file ({e}); download it "
                            "again") from None
    self.fields = reader.fields

  def get(self, key: str, default=KeyError):
    if key not in self.fields:
      if default is KeyError:
        raise CheckpointError(f"{self.path}: metadata key {key!r} is missing")
      return default
    value = self.fields[key].contents()
    return value

  @property
  def architecture(self) -> str:
    return str(self.get("general.architecture"))

  def type_name(self, name: str) -> str:
    return self.tensors[name].tensor_type.name


def _arch_value(f: GGUFFile, key: str, default=KeyError):
  return f.get(f"{f.architecture}.{key}", default)


def _uniform(f: GGUFFile, key: str, value):
  """Per-layer lists (some files store head counts per layer) must be one value here."""
  if isinstance(value, (list, tuple)):
    if len(set(value)) != 1:
      raise CheckpointError(f"{f.path}: {key} differs between layers ({sorted(set(value))}); "
                            "cardjax's decoder has one value for every layer")
    value = value[0]
  return int(value)


def check_file(f: GGUFFile) -> None:
  """One clear error for what cardjax cannot load, before anything is read or written."""
  arch = f.architecture
  if arch not in ARCHITECTURES:
    raise CheckpointError(f"{f.path}: general.architecture={arch!r} is not implemented; "
                          f"cardjax's decoder reads {ARCHITECTURES} (Llama, Qwen2 and Qwen3 "
                          "families)")
  bad = sorted({(f.type_name(n), n) for n in f.tensors if f.type_name(n) not in
                SUPPORTED_TYPES})
  if bad:
    types = sorted({t for t, _ in bad})
    raise CheckpointError(f"{f.path}: tensor {bad[0][1]} (and {len(bad) - 1} more) has type "
                          f"{', '.join(types)}, which cardjax does not read; supported: "
                          f"{', '.join(SUPPORTED_TYPES)} (re-quantize with llama.cpp, or "
                          "import the original HF folder with import-hf)")
  if "rope_freqs.weight" in f.tensors:
    raise CheckpointError(f"{f.path}: per-frequency rope factors (rope_freqs.weight, Llama "
                          "3.1-style scaling) are not read from GGUF yet; import the HF folder "
                          "with import-hf")
  unknown = [n for n in f.tensors if gguf_to_hf_name(n) is None
             or (arch != "qwen3" and n.endswith(QK_NORM_NAMES))]
  if unknown:
    raise CheckpointError(f"{f.path}: tensors {unknown[:4]} are not part of a {arch} decoder "
                          "that cardjax implements")


def gguf_to_hf_name(name: str) -> str | None:
  if name in TOP_NAMES:
    return TOP_NAMES[name]
  parts = name.split(".", 2)
  if len(parts) == 3 and parts[0] == "blk":  # a name like "blk.extra" is unknown, not a crash
    _, index, rest = parts
    if rest in LAYER_NAMES and index.isdigit():
      return f"model.layers.{index}.{LAYER_NAMES[rest]}"
  return None


def hf_config(f: GGUFFile) -> dict:
  """The HF config.json values the file's metadata describe."""
  arch = f.architecture
  heads = _uniform(f, "attention.head_count", _arch_value(f, "attention.head_count"))
  kv = _uniform(f, "attention.head_count_kv", _arch_value(f, "attention.head_count_kv", heads))
  hidden = int(_arch_value(f, "embedding_length"))
  head_dim = int(_arch_value(f, "attention.key_length", hidden // heads))
  rope_dim = int(_arch_value(f, "rope.dimension_count", head_dim))
  if rope_dim != head_dim:
    raise CheckpointError(f"{f.path}: rope.dimension_count={rope_dim} but head_dim="
                          f"{head_dim}; partial rotary embeddings are not implemented")
  embed = f.tensors["token_embd.weight"] if "token_embd.weight" in f.tensors else None
  if embed is None:
    raise CheckpointError(f"{f.path}: token_embd.weight is missing")
  vocab = int(_arch_value(f, "vocab_size", int(embed.shape[1])))
  scaling = str(_arch_value(f, "rope.scaling.type", "none"))
  values = {
      "model_type": arch,
      "vocab_size": vocab,
      "hidden_size": hidden,
      "intermediate_size": int(_arch_value(f, "feed_forward_length")),
      "num_hidden_layers": int(_arch_value(f, "block_count")),
      "num_attention_heads": heads,
      "num_key_value_heads": kv,
      "head_dim": head_dim,
      "rms_norm_eps": float(_arch_value(f, "attention.layer_norm_rms_epsilon", 1e-6)),
      "rope_theta": float(_arch_value(f, "rope.freq_base", 10000.0)),
      "max_position_embeddings": int(_arch_value(f, "context_length", 2048)),
      "tie_word_embeddings": "output.weight" not in f.tensors,
      "hidden_act": "silu",
  }
  if scaling == "linear":
    values["rope_scaling"] = {"rope_type": "linear",
                              "factor": float(_arch_value(f, "rope.scaling.factor"))}
  elif scaling != "none":
    raise CheckpointError(f"{f.path}: rope.scaling.type={scaling!r} is not implemented "
                          "(cardjax reads none and linear from GGUF)")
  if arch in ("llama", "qwen3"):
    values["attention_bias"] = "blk.0.attn_q.bias" in f.tensors
  elif "blk.0.attn_q.bias" not in f.tensors:
    raise CheckpointError(f"{f.path}: a qwen2 model has Q/K/V biases, and this file has none")
  if arch == "qwen3" and "blk.0.attn_q_norm.weight" not in f.tensors:
    raise CheckpointError(f"{f.path}: a qwen3 model has per-head Q/K norms "
                          "(blk.N.attn_q_norm.weight), and this file has none")
  for ours, key in (("bos_token_id", "bos_token_id"), ("eos_token_id", "eos_token_id"),
                    ("pad_token_id", "padding_token_id")):
    value = f.get(f"tokenizer.ggml.{key}", None)
    if value is not None:
      values[ours] = int(value)
  return values


def unpermute(w: np.ndarray, heads: int) -> np.ndarray:
  """Undo llama.cpp's rotary row permutation of a Q or K weight [heads*d, in] or bias."""
  d = w.shape[0] // heads
  return w.reshape(heads, d // 2, 2, *w.shape[1:]).swapaxes(1, 2).reshape(w.shape)


class GGUFTensors:
  """HF tensor names -> fp32 numpy arrays, dequantized (and un-permuted) on demand: the
  reader interface of `cardjax.hf.load_tensors`."""

  def __init__(self, f: GGUFFile, num_heads: int, num_kv_heads: int):
    self.file = f
    self.names = {gguf_to_hf_name(n): n for n in f.tensors}
    self.heads = {"attn_q": num_heads, "attn_k": num_kv_heads}
    self.permuted = f.architecture == "llama"

  def keys(self) -> list[str]:
    return list(self.names)

  def __contains__(self, name: str) -> bool:
    return name in self.names

  def file_of(self, name: str) -> str:
    n = self.names[name]
    return f"{self.file.path} ({n}, {self.file.type_name(n)})"

  def get(self, name: str) -> np.ndarray:
    from gguf.quants import dequantize

    n = self.names[name]
    t = self.file.tensors[n]
    shape = tuple(int(s) for s in reversed(t.shape.tolist()))  # ggml lists the inner dim first
    array = np.asarray(dequantize(t.data, t.tensor_type), np.float32).reshape(shape)
    kind = n.split(".")[2] if n.startswith("blk.") else ""
    if self.permuted and kind in self.heads:
      array = unpermute(array, self.heads[kind])
    return array


def from_gguf(path: "str | Path | GGUFFile", mesh=None, **overrides):
  """A Decoder with the file's weights (fp32 unless `param_dtype` says otherwise).
  `path` may be a GGUFFile already opened (and checked): the file is parsed once.
  `overrides` set ModelConfig fields (scan_layers, param_dtype, mask_token_id, ...); the
  mask id defaults to the tokenizer's (see `mask_token`)."""
  from cardjax.hf.config import model_config_from_hf
  from cardjax.hf.tensors import load_tensors

  f = path if isinstance(path, GGUFFile) else GGUFFile(path)
  check_file(f)
  values = hf_config(f)
  if "mask_token_id" not in overrides and "tokenizer.ggml.tokens" in f.fields:
    overrides["mask_token_id"] = mask_token(f)[1]
  cfg = model_config_from_hf(values, source=str(f.path), **overrides)
  return load_tensors(cfg, GGUFTensors(f, cfg.num_heads, cfg.num_kv_heads), str(f.path), mesh)


def mask_token(f: GGUFFile, requested: str | None = None) -> tuple[str, int]:
  """(token, id) of the [MASK] token MARS and CARD use. `requested` if given; else
  `<|mask|>` when the vocabulary has it; else the last control token that the chat template
  and the bos/eos/pad/unk ids leave unused (SmolLM2: `<empty_output>`, id 16), so no new
  embedding row is needed (MARS adds no parameters)."""
  tokens = list(f.get("tokenizer.ggml.tokens"))
  index = {t: i for i, t in enumerate(tokens)}
  if requested:
    if requested not in index:
      raise CheckpointError(f"--mask-token {requested!r} is not in the vocabulary of {f.path}")
    return requested, index[requested]
  if "<|mask|>" in index:
    return "<|mask|>", index["<|mask|>"]
  types = list(f.get("tokenizer.ggml.token_type", [1] * len(tokens)))
  template = str(f.get("tokenizer.chat_template", ""))
  taken = {int(f.get(f"tokenizer.ggml.{k}", -1)) for k in
           ("bos_token_id", "eos_token_id", "padding_token_id", "unknown_token_id")}
  free = [i for i, (t, kind) in enumerate(zip(tokens, types))
          if kind == CONTROL and i not in taken and t not in template]
  if not free:
    raise CheckpointError(f"{f.path} has no <|mask|> and no unused control token to serve as "
                          "[MASK]; pass --mask-token TOKEN")
  return tokens[free[-1]], free[-1]


def _pre_tokenizer(f: GGUFFile):
  from tokenizers import Regex, normalizers, pre_tokenizers

  from cardjax.data.tokenizer import QWEN2_SPLIT

  pre = str(f.get("tokenizer.ggml.pre", "default"))
  level = pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=True)
  if pre in DIGIT_SPLIT_PRE:
    return None, pre_tokenizers.Sequence([pre_tokenizers.Digits(individual_digits=True), level])
  if pre in PLAIN_PRE:
    return None, level
  split = QWEN2_SPLIT if pre in QWEN2_PRE else LLAMA3_SPLIT if pre in LLAMA3_PRE else None
  if split is None:
    raise CheckpointError(f"{f.path}: tokenizer.ggml.pre={pre!r} is not implemented; cardjax "
                          f"knows {sorted(DIGIT_SPLIT_PRE + PLAIN_PRE + QWEN2_PRE + LLAMA3_PRE)}")
  normalizer = normalizers.NFC() if pre in QWEN2_PRE else None
  return normalizer, pre_tokenizers.Sequence([
      pre_tokenizers.Split(Regex(split), behavior="isolated", invert=False),
      pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False)])


def write_tokenizer(f: GGUFFile, directory: str | Path, mask: str | None = None) -> Path:
  """Write tokenizer.json + tokenizer_config.json (chat template, special tokens, the
  [MASK] token) for the file's byte-level BPE vocabulary into `directory`."""
  from tokenizers import AddedToken, Tokenizer, decoders, models

  kind = str(f.get("tokenizer.ggml.model", ""))
  if kind != "gpt2":
    raise CheckpointError(f"{f.path}: tokenizer.ggml.model={kind!r} is not implemented; "
                          "cardjax rebuilds byte-level BPE ('gpt2') vocabularies")
  tokens = [str(t) for t in f.get("tokenizer.ggml.tokens")]
  merges = [tuple(str(m).split(" ", 1)) for m in f.get("tokenizer.ggml.merges")]
  types = list(f.get("tokenizer.ggml.token_type", [1] * len(tokens)))
  tok = Tokenizer(models.BPE(vocab={t: i for i, t in enumerate(tokens)}, merges=merges,
                             ignore_merges=False))
  normalizer, tok.pre_tokenizer = _pre_tokenizer(f)
  if normalizer is not None:
    tok.normalizer = normalizer
  tok.decoder = decoders.ByteLevel()
  tok.add_special_tokens([AddedToken(t, special=True, normalized=False)
                          for t, k in zip(tokens, types) if k == CONTROL])
  tok.add_tokens([AddedToken(t, special=False, normalized=False)
                  for t, k in zip(tokens, types) if k == USER_DEFINED])
  if tok.get_vocab_size(with_added_tokens=True) != len(tokens):
    raise CheckpointError(f"{f.path}: rebuilding the vocabulary gave "
                          f"{tok.get_vocab_size(with_added_tokens=True)} ids for "
                          f"{len(tokens)} tokens")
  mask_text, _ = mask_token(f, mask)

  def name(key):
    value = f.get(f"tokenizer.ggml.{key}", None)
    return tokens[int(value)] if value is not None else None

  config = {"tokenizer_class": "PreTrainedTokenizerFast",
            "bos_token": name("bos_token_id"), "eos_token": name("eos_token_id"),
            "pad_token": name("padding_token_id") or name("eos_token_id"),
            "unk_token": name("unknown_token_id"), "mask_token": mask_text,
            "add_bos_token": bool(f.get("tokenizer.ggml.add_bos_token", False)),
            "clean_up_tokenization_spaces": False,
            "model_max_length": int(_arch_value(f, "context_length", 2048))}
  template = f.get("tokenizer.chat_template", None)
  if template is not None:
    config["chat_template"] = str(template)
  directory = Path(directory)
  directory.mkdir(parents=True, exist_ok=True)
  tok.save(str(directory / "tokenizer.json"))
  config = {k: v for k, v in config.items() if v is not None}
  (directory / "tokenizer_config.json").write_text(json.dumps(config, indent=2) + "\n")
  return directory
