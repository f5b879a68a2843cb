"""Tiny GGUF files written the way llama.cpp's convert_hf_to_gguf.py writes them.

The tests' own name table, permutation and metadata, independent of cardjax/hf/gguf.py: a
random-init transformers model goes in, a .gguf file whose tensors are in torch Linear
layout [out, in] (the writer stores ggml's reversed shape) comes out. Quantized types go
through gguf's own quantizer, except Q4_K and Q6_K, which gguf's python package can only
dequantize: those tensors are random raw blocks with small, valid fp16 scales, and the file
is then the only truth about their weights.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np

CONTROL, NORMAL = 3, 1
# Control tokens first, as SmolLM2 lays them out: unk 0, bos 1, eos = pad 2.
CONTROLS = ("<|endoftext|>", "<|im_start|>", "<|im_end|>", "<repo_name>", "<empty_output>")
# A few merges on top of the 256 byte-level symbols. "1 2" and "12 3" make a digit-splitting
# pre-tokenizer observable: without it "12345" would be 3 tokens.
MERGES = ("Ġ t", "h e", "Ġt he", "i n", "e r", "o n", "1 2", "12 3", "Ġ a")
# ChatML with a default system turn, like SmolLM2's template (shorter).
CHAT_TEMPLATE = (
    "{% for message in messages %}{% if loop.first and messages[0]['role'] != 'system' %}"
    "{{ '<|im_start|>system\\nYou are a tiny model<|im_end|>\\n' }}{% endif %}"
    "{{ '<|im_start|>' + message['role'] + '\\n' + message['content'] + '<|im_end|>' + '\\n' }}"
    "{% endfor %}{% if add_generation_prompt %}{{ '<|im_start|>assistant\\n' }}{% endif %}")
# llama.cpp's names for the HF names (outside model.layers.{i}. and inside it).
TOP = {"model.embed_tokens.weight": "token_embd.weight",
       "model.norm.weight": "output_norm.weight", "lm_head.weight": "output.weight"}
LAYER = {"input_layernorm.weight": "attn_norm.weight",
         "self_attn.q_proj.weight": "attn_q.weight", "self_attn.k_proj.weight": "attn_k.weight",
         "self_attn.v_proj.weight": "attn_v.weight",
         "self_attn.o_proj.weight": "attn_output.weight",
         "self_attn.q_proj.bias": "attn_q.bias", "self_attn.k_proj.bias": "attn_k.bias",
         "self_attn.v_proj.bias": "attn_v.bias",
         "self_attn.q_norm.weight": "attn_q_norm.weight",
         "self_attn.k_norm.weight": "attn_k_norm.weight",
         "post_attention_layernorm.weight": "ffn_norm.weight",
         "mlp.gate_proj.weight": "ffn_gate.weight",
         "mlp.up_proj.weight": "ffn_up.weight", "mlp.down_proj.weight": "ffn_down.weight"}
# Types gguf's python package cannot quantize: random raw blocks (bytes per 256 weights).
RAW_BLOCK_BYTES = {"Q4_K": 144, "Q5_K": 176, "Q6_K": 210, "Q2_K": 84}


def vocabulary(extra_controls: tuple[str, ...] = ()) -> tuple[list[str], list[int], list[str]]:
  """(tokens, token types, merges) of a small byte-level BPE vocabulary."""
  from tokenizers.pre_tokenizers import ByteLevel

  controls = list(CONTROLS) + list(extra_controls)
  tokens = controls + sorted(ByteLevel.alphabet()) + [m.replace(" ", "") for m in MERGES]
  types = [CONTROL] * len(controls) + [NORMAL] * (len(tokens) - len(controls))
  assert len(set(tokens)) == len(tokens)
  return tokens, types, list(MERGES)


def permute(w: np.ndarray, n_head: int) -> np.ndarray:
  """llama.cpp's LlamaModel.permute: HF's rotate-halves rows -> adjacent-pair rows."""
  return w.reshape(n_head, 2, w.shape[0] // n_head // 2, *w.shape[1:]).swapaxes(1, 2).reshape(
      w.shape)


def raw_kquant(shape: tuple[int, int], qtype: str, seed: int) -> np.ndarray:
  """Random bytes of a K-quant tensor [rows, row bytes] whose fp16 scales are small and
  finite (so the weights are O(0.1) and the logits O(1..10))."""
  rows, cols = shape
  assert cols % 256 == 0, f"K-quant rows need a multiple of 256 values, got {cols}"
  rng = np.random.default_rng(seed)
  blocks = rng.integers(0, 256, (rows * cols // 256, RAW_BLOCK_BYTES[qtype]), dtype=np.uint8)

  def f16(size, low, high):
    return rng.uniform(low, high, (blocks.shape[0], size)).astype(np.float16).view(np.uint8)

  if qtype in ("Q4_K", "Q5_K"):  # d at bytes 0-1, dmin at 2-3 (w = d*sc*q - dmin*m)
    # E[sc * q] ~ 31.5 * 7.5 and E[m] ~ 31.5, so dmin ~ 7.5 d centres the weights on 0.
    blocks[:, 0:2] = f16(1, 4e-4, 6e-4)
    blocks[:, 2:4] = f16(1, 3e-3, 4.5e-3)
  elif qtype == "Q6_K":  # d at bytes 208-209 (w = d * int8 scale * (q - 32))
    blocks[:, 208:210] = f16(1, 2e-5, 6e-5)
  elif qtype == "Q2_K":  # d at bytes 80-81, dmin at 82-83
    blocks[:, 80:82] = f16(1, 2e-3, 4e-3)
    blocks[:, 82:84] = f16(1, 2e-3, 4e-3)
  return blocks.reshape(rows, -1)


def encode(array: np.ndarray, qtype: str, seed: int = 0):
  """(data, raw_dtype) for GGUFWriter.add_tensor: `array` in `qtype`."""
  import gguf

  t = gguf.GGMLQuantizationType[qtype]
  if qtype == "F32":
    return np.ascontiguousarray(array, np.float32), None
  if qtype == "F16":
    return np.ascontiguousarray(array, np.float16), None
  if qtype in RAW_BLOCK_BYTES:
    return raw_kquant(array.shape, qtype, seed), t
  return gguf.quants.quantize(np.ascontiguousarray(array, np.float32), t), t


def hf_to_gguf_tensors(torch_model, arch: str) -> dict[str, np.ndarray]:
  """llama.cpp names -> float arrays [out, in] of a transformers model, Q and K permuted for
  llama as convert_hf_to_gguf.py does (weights and biases; n_head_kv for K); qwen2 and
  qwen3 as they are (Qwen3's q/k norms included)."""
  cfg = torch_model.config
  out = {}
  for name, p in torch_model.state_dict().items():
    array = p.detach().float().numpy()
    if name in TOP:
      if name == "lm_head.weight" and cfg.tie_word_embeddings:
        continue
      out[TOP[name]] = array
      continue
    _, _, index, rest = name.split(".", 3)  # model.layers.{i}.rest
    gname = LAYER[rest]
    if arch == "llama" and gname.startswith("attn_q."):
      array = permute(array, cfg.num_attention_heads)
    elif arch == "llama" and gname.startswith("attn_k."):
      array = permute(array, cfg.num_key_value_heads)
    out[f"blk.{index}.{gname}"] = array
  return out


def write_gguf(path: str | Path, arch: str, meta: dict, tensors: dict, *,
               vocab=None, pre: str = "smollm", chat_template: str | None = CHAT_TEMPLATE,
               token_ids: dict | None = None) -> Path:
  """A GGUF file. `meta`: the `{arch}.` keys (block_count, ...) as python values; `tensors`:
  name -> (data, raw_dtype) as `encode` returns them; `vocab`: (tokens, types, merges)."""
  import gguf

  path = Path(path)
  w = gguf.GGUFWriter(str(path), arch)
  w.add_name("tiny test model")
  w.add_block_count(meta["block_count"])
  w.add_context_length(meta["context_length"])
  w.add_embedding_length(meta["embedding_length"])
  w.add_feed_forward_length(meta["feed_forward_length"])
  w.add_head_count(meta["head_count"])
  w.add_head_count_kv(meta["head_count_kv"])
  w.add_rope_freq_base(meta["rope_freq_base"])
  w.add_layer_norm_rms_eps(meta["rms_eps"])
  w.add_rope_dimension_count(meta["rope_dimension_count"])
  if "key_length" in meta:
    w.add_key_length(meta["key_length"])
    w.add_value_length(meta["key_length"])
  w.add_file_type(meta.get("file_type", 0))
  tokens, types, merges = vocab if vocab is not None else vocabulary()
  w.add_vocab_size(len(tokens))
  w.add_tokenizer_model("gpt2")
  w.add_tokenizer_pre(pre)
  w.add_token_list(tokens)
  w.add_token_types(types)
  w.add_token_merges(merges)
  ids = {"bos": 1, "eos": 2, "unk": 0, "pad": 2, **(token_ids or {})}
  w.add_bos_token_id(ids["bos"])
  w.add_eos_token_id(ids["eos"])
  w.add_unk_token_id(ids["unk"])
  w.add_pad_token_id(ids["pad"])
  w.add_add_bos_token(False)
  if chat_template is not None:
    w.add_chat_template(chat_template)
  for name, (data, raw_dtype) in tensors.items():
    w.add_tensor(name, data, raw_dtype=raw_dtype)
  w.write_header_to_file()
  w.write_kv_data_to_file()
  w.write_tensors_to_file()
  w.close()
  return path


def model_meta(torch_model) -> dict:
  cfg = torch_model.config
  head_dim = getattr(cfg, "head_dim", None) or cfg.hidden_size // cfg.num_attention_heads
  meta = dict(block_count=cfg.num_hidden_layers, context_length=cfg.max_position_embeddings,
              embedding_length=cfg.hidden_size, feed_forward_length=cfg.intermediate_size,
              head_count=cfg.num_attention_heads, head_count_kv=cfg.num_key_value_heads,
              rope_freq_base=float(getattr(cfg, "rope_theta", None)
                                   or cfg.rope_parameters["rope_theta"]),
              rms_eps=cfg.rms_norm_eps, rope_dimension_count=head_dim)
  if "head_dim" in cfg.to_dict():  # the converter writes key/value_length from it
    meta["key_length"] = head_dim
  return meta


def write_model(path: str | Path, torch_model, arch: str, qtype: str = "F32", seed: int = 0,
                drop: tuple[str, ...] = (), add: dict | None = None, **kwargs) -> Path:
  """`torch_model` as a GGUF file: every 2-D weight in `qtype`, norms and biases F32 (as
  llama.cpp keeps them). `drop` leaves tensors out; `add` adds name -> (data, raw_dtype)."""
  tensors = {}
  for i, (name, array) in enumerate(hf_to_gguf_tensors(torch_model, arch).items()):
    if name in drop:
      continue
    tensors[name] = encode(array, qtype, seed + i) if array.ndim == 2 else encode(array, "F32")
  tensors.update(add or {})
  return write_gguf(path, arch, model_meta(torch_model), tensors, **kwargs)
