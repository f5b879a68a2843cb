"""The [MASK] id of a Hugging Face folder, read from its tokenizer files.

Released MARS checkpoints (the public Xalp/MARS code, model_type `a2d-qwen2`) record [MASK]
only in the tokenizer: `add_special_tokens({"mask_token": "<|mask|>"})` before
save_pretrained puts `<|mask|>` at the first id past Qwen2.5's vocabulary (151665, a row of
the padded embedding) into tokenizer.json's added_tokens and names it as
tokenizer_config.json's mask_token; config.json has no mask_token_id. The lookup follows
cardjax's Tokenizer (the config's mask_token if named, else `<|mask|>`), so the id recorded
at import is the one `cardjax generate` finds in the same files.
"""

from __future__ import annotations

import json
import logging
from pathlib import Path

from cardjax.errors import CheckpointError

log = logging.getLogger("cardjax.hf")

MASK = "<|mask|>"


def _read(path: Path):
  if not path.is_file():
    return None
  try:
    return json.loads(path.read_text())
  except json.JSONDecodeError as e:
    raise CheckpointError(f"{path} is not valid JSON: {e}") from None


def _text(value) -> str | None:
  if isinstance(value, dict):  # {"content": "<|mask|>", ...} in some tokenizer configs
    value = value.get("content")
  return value if isinstance(value, str) and value else None


def _token_ids(directory: Path) -> dict[str, int]:
  """token text -> id from tokenizer.json (BPE vocab and added tokens) and
  tokenizer_config.json's added_tokens_decoder."""
  ids: dict[str, int] = {}
  tok = _read(directory / "tokenizer.json") or {}
  vocab = (tok.get("model") or {}).get("vocab")
  if isinstance(vocab, dict):
    ids.update({t: int(i) for t, i in vocab.items()})
  for added in tok.get("added_tokens") or []:
    ids[added["content"]] = int(added["id"])
  config = _read(directory / "tokenizer_config.json") or {}
  for i, added in (config.get("added_tokens_decoder") or {}).items():
    if _text(added):
      ids.setdefault(_text(added), int(i))
  return ids


def tokenizer_mask(directory: str | Path) -> tuple[str, int] | None:
  """(token, id) of the folder's [MASK]: tokenizer_config.json's mask_token, else `<|mask|>`;
  None when the tokenizer has neither (or the folder has no tokenizer files)."""
  directory = Path(directory)
  config = _read(directory / "tokenizer_config.json") or {}
  named = _text(config.get("mask_token"))
  ids = _token_ids(directory)
  if named is not None:
    if named not in ids:
      raise CheckpointError(f"{directory}/tokenizer_config.json names mask_token {named!r}, "
                            "which the tokenizer does not have; pass --mask-token-id")
    return named, ids[named]
  return (MASK, ids[MASK]) if MASK in ids else None


def import_mask_id(directory: str | Path, config: dict) -> int | None:
  """The [MASK] id `import-hf` records when config.json (`config`) has no mask_token_id:
  the tokenizer's, checked to have an embedding row. None: nothing to add."""
  if "mask_token_id" in config:
    return None  # model_config_from_hf reads it
  found = tokenizer_mask(directory)
  if found is None:
    return None
  token, mask_id = found
  vocab = config.get("vocab_size")
  if isinstance(vocab, int) and not 0 <= mask_id < vocab:
    raise CheckpointError(f"the tokenizer of {directory} has {token} at id {mask_id}, outside "
                          f"the model's vocab_size={vocab} (no embedding row); pass "
                          "--mask-token-id with an id inside the vocabulary, or -1 for none")
  log.info("[MASK] = %r (id %d) from the tokenizer of %s", token, mask_id, directory)
  return mask_id
