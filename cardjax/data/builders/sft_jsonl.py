"""sft_jsonl: JSONL conversations (local or in a bucket) for supervised fine-tuning.

Each non-blank line is either
  {"messages": [{"role": "system"|"user"|"assistant", "content": str}, ...]} or
  {"prompt": str, "response": str}  (becomes a user + an assistant message),
with an optional "answer" (str or number; kept for grading). Other keys are ignored.
Features: {"messages": JSON text of the message list, "answer": text, "" if none}.

validation_percent (default 0: train only) sends that share of lines to a "validation"
split by a stable hash of the line's content, so duplicate lines never straddle splits.
A Beam build (builders.build(..., beam_runner=...)) reads one file per work item and stores
the same records.
"""

from __future__ import annotations

import dataclasses
import functools
import json
from typing import ClassVar

import tensorflow_datasets as tfds

from cardjax.data.builders.common import (LOG, ConversationBuilder, PathsConfig, in_validation,
                                          nonempty_splits)
from cardjax.data.builders.text_corpus import (beam_counts, check_beam_stored, match_files,
                                               parse_json_line)
from cardjax.data.files import open_binary
from cardjax.errors import CardjaxError

ROLES = ("system", "user", "assistant")


@dataclasses.dataclass(eq=False)
class SftJsonlConfig(PathsConfig):
  BUILDER: ClassVar[str] = "sft_jsonl"
  validation_percent: int = 0  # conversations are usually split upstream


def to_messages(record, where: str) -> tuple[list[dict], str]:
  """(messages, answer) of one parsed line; CardjaxError naming `where` if malformed."""
  if not isinstance(record, dict):
    raise CardjaxError(f"{where}: expected a JSON object, got {type(record).__name__}")
  if "messages" in record:
    raw = record["messages"]
    if not isinstance(raw, list) or not raw:
      raise CardjaxError(f"{where}: 'messages' must be a non-empty list")
    messages = []
    for i, m in enumerate(raw):
      if not isinstance(m, dict) or m.get("role") not in ROLES:
        role = m.get("role") if isinstance(m, dict) else m
        raise CardjaxError(f"{where}: message {i} has role {role!r}; use one of {ROLES}")
      if not isinstance(m.get("content"), str):
        raise CardjaxError(f"{where}: message {i} ({m['role']}) needs a string 'content'")
      messages.append({"role": m["role"], "content": m["content"]})
  elif "prompt" in record or "response" in record:
    if not (isinstance(record.get("prompt"), str) and isinstance(record.get("response"), str)):
      raise CardjaxError(f"{where}: 'prompt' and 'response' must both be strings")
    messages = [{"role": "user", "content": record["prompt"]},
                {"role": "assistant", "content": record["response"]}]
  else:
    raise CardjaxError(
        f"{where}: needs 'messages' or 'prompt' + 'response' (has: {', '.join(record)})")
  if not any(m["role"] == "assistant" for m in messages):
    raise CardjaxError(f"{where}: no assistant message, nothing to learn from")
  answer = record.get("answer", "")
  if isinstance(answer, bool) or not isinstance(answer, (str, int, float)):
    raise CardjaxError(f"{where}: 'answer' must be a string or a number")
  return messages, str(answer)


def _lines(files):
  """(path, relative path, line number, stripped line) of every non-blank line."""
  for path, rel in files:
    with open_binary(path) as f:
      for lineno, raw in enumerate(f, 1):
        try:
          line = raw.decode("utf-8").strip().removeprefix("\ufeff")
        except UnicodeDecodeError as e:
          raise CardjaxError(f"{path}:{lineno}: invalid UTF-8 ({e.reason})") from None
        if line:
          yield path, rel, lineno, line


def split_of(line: str, percent: int) -> str:
  return "validation" if in_validation(line, percent) else "train"


def conversations(files, split: str, percent: int):
  """(key, example) of the lines of `files` that fall in `split`."""
  for path, rel, lineno, line in _lines(files):
    if split_of(line, percent) != split:
      continue
    messages, answer = to_messages(parse_json_line(line, path, lineno), f"{path}:{lineno}")
    # Keyed by the relative path: the record order must not depend on where the files lie.
    yield f"{rel}:{lineno}", {"messages": json.dumps(messages, ensure_ascii=False),
                              "answer": answer}


# Beam counters of the conversations read: namespace BEAM_COUNTERS/SPLIT, name "read".
BEAM_COUNTERS = "cardjax.sft_jsonl"


def _beam_file_conversations(path_rel, split: str, percent: int):
  """conversations of one file on a Beam worker, counted in Beam's metrics."""
  from apache_beam.metrics import Metrics

  count = 0
  for item in conversations([tuple(path_rel)], split, percent):
    count += 1
    yield item
  Metrics.counter(f"{BEAM_COUNTERS}/{split}", "read").inc(count)


def beam_conversations(files, split: str, percent: int):
  """A Beam PTransform of the conversations of `split`, one file a work item."""
  import apache_beam as beam

  @beam.ptransform_fn
  def read_files(pipeline):
    return (pipeline
            | "Files" >> beam.Create(list(files))
            | "Spread" >> beam.Reshuffle()
            | "Conversations" >> beam.FlatMap(_beam_file_conversations, split, percent))

  return read_files()  # pylint: disable=no-value-for-parameter


class SftJsonl(ConversationBuilder):
  """JSONL conversations ({"messages": JSON, "answer"}), local or in a bucket."""

  SUPPORTS_BEAM = True
  use_beam = False  # set by builders.build for a Beam build

  CONFIG_CLS = SftJsonlConfig
  VERSION = tfds.core.Version("1.1.0")
  RELEASE_NOTES = {"1.0.0": "First version.",
                   "1.1.0": "Example keys from relative paths: the same order in any folder."}

  def _split_lines(self, files, split):
    percent = self.builder_config.validation_percent
    return (item for item in _lines(files) if split_of(item[-1], percent) == split)

  def _split_generators(self, dl_manager):
    del dl_manager
    cfg = self.builder_config
    files = match_files(cfg.paths)
    wanted = ["train", "validation"] if cfg.validation_percent else ["train"]
    splits = nonempty_splits({s: functools.partial(self._split_lines, files, s) for s in wanted})
    if not splits:
      raise CardjaxError("dataset sft_jsonl: no lines in the files matching "
                         f"{', '.join(cfg.paths)}")
    if self.use_beam:
      return {s: beam_conversations(files, s, cfg.validation_percent) for s in splits}
    return {s: self._generate_examples(files, s) for s in splits}

  def _process_pipeline_result(self, pipeline_result) -> None:
    self._beam_read = {split: counts.get("read")
                       for split, counts in beam_counts(pipeline_result, BEAM_COUNTERS).items()}

  def _download_and_prepare(self, dl_manager, download_config) -> None:
    super()._download_and_prepare(dl_manager, download_config)
    if self.use_beam:  # as text_corpus: a runner that lost work fails the build
      check_beam_stored(self, self._beam_read)

  def _generate_examples(self, files, split):
    count = 0
    for key, example in conversations(files, split, self.builder_config.validation_percent):
      count += 1
      yield key, example
    LOG.info("sft_jsonl %s: %d conversations", split, count)
