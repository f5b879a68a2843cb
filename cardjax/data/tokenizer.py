"""Tokenizers: a HF `tokenizer.json` folder, or a byte-level BPE trained on the corpus.

Both are the same object: a `tokenizers.Tokenizer` plus the `tokenizer_config.json` fields
that matter here (special tokens and the jinja chat template). A trained tokenizer is saved
as a HF folder, so transformers' AutoTokenizer loads it too. Every tokenizer has a [MASK]
token: the one tokenizer_config.json names as `mask_token`, else `<|mask|>` (added as the next
id when absent: for Qwen2.5 that is 151665, the first padded embedding row), and it must
equal the config's `model.mask_token_id`. A tokenizer folder may be a bucket URI (gs://,
s3://): it is read and written through etils.epath.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Iterable, Sequence

import numpy as np

from cardjax.errors import CardjaxError
from cardjax.storage import as_path, is_remote
from cardjax.storage.errors import storage_errors
from cardjax.storage.reach import check_endpoint

MASK = "<|mask|>"
EOS = "<|endoftext|>"
IM_START, IM_END = "<|im_start|>", "<|im_end|>"
# Special tokens of the trained tokenizers, at ids 0..3 (Qwen's names, so ChatML matches).
SPECIALS = (EOS, IM_START, IM_END, MASK)

# ChatML, as the Qwen2.5 instruct models format conversations.
CHATML = (
    "{% for message in messages %}"
    "{{ '<|im_start|>' + message['role'] + '\\n' + message['content'] + '<|im_end|>' + '\\n' }}"
    "{% endfor %}"
    "{% if add_generation_prompt %}{{ '<|im_start|>assistant\\n' }}{% endif %}")


def _token_text(value) -> str | None:
  if isinstance(value, dict):  # {"content": "<|endoftext|>", ...} in older configs
    return value.get("content")
  return value


class Tokenizer:
  """Text <-> ids, special ids, and chat rendering with a per-token loss mask."""

  def __init__(self, tok, config: dict, source: str = "", mask_token_id: int | None = None):
    self.tok = tok
    self.config = dict(config)
    self.source = source
    # The config's mask_token names an existing token (a GGUF import reuses an unused
    # control token, so no embedding row is added); without one, <|mask|> is added if absent.
    mask = _token_text(self.config.get("mask_token")) or MASK
    if tok.token_to_id(mask) is None:
      if mask != MASK:
        raise CardjaxError(f"mask_token {mask!r} of {source}/tokenizer_config.json is not in "
                           "its vocabulary")
      tok.add_special_tokens([MASK])
    self.mask_id = tok.token_to_id(mask)
    if mask_token_id is not None and mask_token_id >= 0 and mask_token_id != self.mask_id:
      raise CardjaxError(f"model.mask_token_id={mask_token_id} but the tokenizer at {source} "
                         f"has {mask} at id {self.mask_id}; set model.mask_token_id="
                         f"{self.mask_id}")
    eos = _token_text(self.config.get("eos_token")) or EOS
    self.eos_id = self._id(eos, "eos_token")
    pad = _token_text(self.config.get("pad_token"))
    self.pad_id = self._id(pad, "pad_token") if pad else self.eos_id
    # Generation stops at the end of an assistant turn as well as at end of text.
    self.stop_ids = tuple(sorted({self.eos_id} | ({tok.token_to_id(IM_END)} - {None})))
    self.chat_template = self.config.get("chat_template") or CHATML

  def _id(self, token: str, what: str) -> int:
    i = self.tok.token_to_id(token)
    if i is None:
      raise CardjaxError(f"{what} {token!r} of {self.source} is not in its vocabulary")
    return i

  @property
  def vocab_size(self) -> int:
    """Ids run 0..vocab_size-1 (added tokens included)."""
    return self.tok.get_vocab_size(with_added_tokens=True)

  def encode(self, text: str) -> list[int]:
    return self.tok.encode(text, add_special_tokens=False).ids

  def decode(self, ids: Sequence[int], skip_special: bool = False) -> str:
    return self.tok.decode([int(i) for i in ids], skip_special_tokens=skip_special)

  def __getstate__(self):
    # The compiled template is rebuilt on demand: jinja templates do not pickle, and grain
    # ships transforms (and so this tokenizer) to its worker processes.
    return {k: v for k, v in self.__dict__.items() if k != "_template"}

  def render_chat(self, messages: Sequence[dict], add_generation_prompt: bool = False) -> str:
    if "_template" not in self.__dict__:
      from jinja2.sandbox import ImmutableSandboxedEnvironment

      source = self.source

      def raise_exception(message):
        raise CardjaxError(f"chat template of {source}: {message}")

      env = ImmutableSandboxedEnvironment(trim_blocks=True, lstrip_blocks=True)
      env.globals["raise_exception"] = raise_exception
      self._template = env.from_string(self.chat_template)
    return self._template.render(messages=list(messages),
                                 add_generation_prompt=add_generation_prompt,
                                 eos_token=self.tok.id_to_token(self.eos_id))

  def encode_chat(self, messages: Sequence[dict]) -> tuple[np.ndarray, np.ndarray]:
    """(ids, loss_mask): the mask is 1 on assistant response tokens (content and the
    end-of-turn token), 0 on system/user turns and on the assistant headers.

    The rendered text is cut at each assistant turn and each piece encoded on its own, so
    no BPE merge crosses a prompt/response boundary.
    """
    pieces: list[tuple[str, int]] = []
    done = ""
    for k, message in enumerate(messages):
      if message["role"] != "assistant":
        continue
      prompt = self.render_chat(messages[:k], add_generation_prompt=True)
      full = self.render_chat(messages[:k + 1])
      if not (prompt.startswith(done) and full.startswith(prompt)):
        raise CardjaxError(f"the chat template of {self.source} does not render "
                           "conversations prefix by prefix; cannot mark response tokens")
      pieces += [(prompt[len(done):], 0), (full[len(prompt):], 1)]
      done = full
    if not pieces:
      raise CardjaxError("a conversation needs at least one assistant message")
    ids, mask = [], []
    for text, weight in pieces:
      piece = self.encode(text)
      ids += piece
      mask += [weight] * len(piece)
    return np.asarray(ids, np.int32), np.asarray(mask, np.int32)

  def save(self, directory: str | Path) -> Path:
    config_text = json.dumps(self.config, indent=2) + "\n"
    if is_remote(directory):
      check_endpoint(str(directory))
      remote = as_path(directory)
      with storage_errors(str(remote), "write"):
        remote.mkdir(parents=True, exist_ok=True)
        (remote / "tokenizer.json").write_text(self.tok.to_str(pretty=True))
        (remote / "tokenizer_config.json").write_text(config_text)
      return remote
    directory = Path(directory)
    directory.mkdir(parents=True, exist_ok=True)
    self.tok.save(str(directory / "tokenizer.json"))
    (directory / "tokenizer_config.json").write_text(config_text)
    return directory


def load_tokenizer(directory: str | Path, mask_token_id: int | None = None) -> Tokenizer:
  """A HF tokenizer folder (tokenizer.json, optional tokenizer_config.json)."""
  from tokenizers import Tokenizer as HFTokenizer

  if is_remote(directory):
    check_endpoint(str(directory))
  directory = as_path(directory) if is_remote(directory) else Path(directory)
  path = directory / "tokenizer.json"
  with storage_errors(str(directory)):
    if not path.is_file():
      raise CardjaxError(f"{path} is missing; point data.tokenizer at a folder with "
                         "tokenizer.json (a HF model folder), or leave it empty to use the "
                         "dataset's own trained tokenizer")
    config_path = directory / "tokenizer_config.json"
    config = json.loads(config_path.read_text()) if config_path.is_file() else {}
    tok = HFTokenizer.from_str(path.read_text())
  return Tokenizer(tok, config, str(directory), mask_token_id)


# Qwen2's pre-tokenization split (its published tokenizer.json): contractions, letter runs
# with one leading non-letter, single digits, punctuation runs, newline runs, spaces.
QWEN2_SPLIT = (r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}"
               r"| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+")


def train_bpe(texts: Iterable[str], vocab_size: int, directory: str | Path) -> Tokenizer:
  """Train a byte-level BPE (specials at ids 0..3) and save it as a HF folder.

  The normalizer and pre-tokenizer are Qwen2's (NFC, its split regex, byte level): for a
  folder whose config.json says qwen2, transformers 5 loads the tokenizer as
  Qwen2Tokenizer, which rebuilds that pipeline around the saved vocab and merges, so an
  exported model tokenizes exactly as it was trained."""
  from tokenizers import Regex, normalizers
  from tokenizers import Tokenizer as HFTokenizer
  from tokenizers import decoders, models, pre_tokenizers, trainers

  if vocab_size < 256 + len(SPECIALS):
    raise CardjaxError(f"a byte-level BPE needs vocab_size >= {256 + len(SPECIALS)}, "
                       f"got {vocab_size}")
  tok = HFTokenizer(models.BPE())
  tok.normalizer = normalizers.NFC()
  tok.pre_tokenizer = pre_tokenizers.Sequence([
      pre_tokenizers.Split(Regex(QWEN2_SPLIT), behavior="isolated", invert=False),
      pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False)])
  tok.decoder = decoders.ByteLevel()
  trainer = trainers.BpeTrainer(vocab_size=vocab_size, special_tokens=list(SPECIALS),
                                initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
                                show_progress=False)
  tok.train_from_iterator(texts, trainer)
  config = {"tokenizer_class": "PreTrainedTokenizerFast", "eos_token": EOS, "pad_token": EOS,
            "mask_token": MASK, "chat_template": CHATML, "clean_up_tokenization_spaces": False}
  tokenizer = Tokenizer(tok, config, str(directory))
  tokenizer.save(directory)
  return tokenizer
