"""text_corpus: text, source-code, JSONL and Parquet files as a corpus of {"text", "source"}.

A `.jsonl` file (also `.jsonl.gz`, `.jsonl.zst`) gives one example per line (its
`text_field`, `a.b` for a nested one), a `.parquet` file one per row (its `text_field`
column, `a.b` for a struct's field); any other file (.txt, .py, .md, ...; also .txt.gz,
.txt.zst, decompressed) is one example. Files may be local or in a bucket (gs://, s3://).
Files are split train/validation by a stable hash of their path relative to the common
root of the patterns, so a file's split survives moving the tree (or a copy to a bucket).
Blank texts are skipped and counted; the counts go to the log and to the build's
metadata.json (per split: files, examples, empty, undecodable; a Beam build gathers them as
Beam counters, and checks its stored examples against them).
"""

from __future__ import annotations

import collections
import dataclasses
import functools
import json
import os
import re
from typing import ClassVar

import tensorflow_datasets as tfds

from cardjax.data.builders.common import LOG, PathsConfig, in_validation, nonempty_splits
from cardjax.data.builders.corpus_formats import (file_bytes, is_jsonl, is_parquet,
                                                  jsonl_lines, parquet_values)
from cardjax.data.files import common_root, glob_files, relative
from cardjax.errors import CardjaxError

DECODE_MODES = ("error", "replace", "skip")
_MAGIC = re.compile(r"[*?[]")


@dataclasses.dataclass(eq=False)
class TextCorpusConfig(PathsConfig):
  BUILDER: ClassVar[str] = "text_corpus"
  # The field of a .jsonl record / column of a .parquet file that holds the text; a.b is
  # field b of object (struct) a.
  text_field: str = "text"
  on_decode_error: str = "error"  # error | replace (U+FFFD) | skip (drop the file / line)

  def validate(self) -> None:
    super().validate()
    self.check_choice("on_decode_error", DECODE_MODES)


def _static_root(pattern: str) -> str:
  """The directory part of a pattern before its first wildcard (a file's own directory)."""
  parts = pattern.split(os.sep)
  keep = []
  for part in parts:
    if _MAGIC.search(part):
      break
    keep.append(part)
  else:
    keep = keep[:-1]  # no wildcard: the pattern names a file
  return os.sep.join(keep) or os.sep


def match_files(patterns: tuple[str, ...]) -> list[tuple[str, str]]:
  """Sorted (absolute path or bucket URI, path relative to the patterns' common root) of
  every match."""
  # The common root keeps relative paths unique even across patterns (checked first: it
  # refuses a mix of local and bucket paths before anything is listed).
  root = common_root([_static_root(p) for p in patterns])
  found, missing = set(), []
  for pattern in patterns:
    hits = glob_files(pattern)
    if not hits:
      missing.append(pattern)
    found.update(hits)
  if missing:
    raise CardjaxError(
        f"no file matches {', '.join(missing)} (of paths {', '.join(patterns)}); check the "
        "paths option (a directory needs a pattern such as DIR/**/*.txt)")
  # Keys and order come from the relative paths: tfds orders records by a hash of the example
  # key, so a key with the absolute path would order the same files differently in another
  # folder (and another host's mount would train on another order).
  # Bucket keys are relative to the bucket's common root too: a corpus copied from disk to
  # a bucket builds the same keys, so the same records in the same order.
  return sorted(((p, relative(p, root)) for p in found), key=lambda pr: pr[1])


def _decode(data: bytes, mode: str, path: str, base: int = 0, line: int = 0) -> str | None:
  """UTF-8 text of `data` (None when mode is skip and it is not UTF-8)."""
  try:
    return data.decode("utf-8")
  except UnicodeDecodeError as e:
    if mode == "replace":
      return data.decode("utf-8", errors="replace")
    if mode == "skip":
      return None
    where = f"{path}:{line}" if line else path
    raise CardjaxError(
        f"{where}: invalid UTF-8 at byte offset {base + e.start} ({e.reason}); pass "
        "on_decode_error=replace to substitute U+FFFD for the bad bytes, or "
        f"on_decode_error=skip to drop the {'line' if line else 'file'}") from None


def parse_json_line(line: str, path: str, lineno: int):
  try:
    return json.loads(line)
  except json.JSONDecodeError as e:
    raise CardjaxError(f"{path}:{lineno}: invalid JSON ({e.msg} at column {e.colno})") from None


def json_field(record, name: str):
  """record[name], else the dotted path into nested objects ("meta.text"); None if absent."""
  if not isinstance(record, dict):
    return None
  if name in record:
    return record[name]
  value = record
  for part in name.split("."):
    if not isinstance(value, dict) or part not in value:
      return None
    value = value[part]
  return value


def _jsonl_examples(path, rel, text_field, mode, stats):
  """Lines of a .jsonl (.gz, .zst) file; byte offsets of bad UTF-8 are in the decompressed
  text."""
  offset, records, undecodable = 0, 0, 0
  for lineno, raw in enumerate(jsonl_lines(path), 1):
    base, offset = offset, offset + len(raw)
    line = _decode(raw, mode, path, base, lineno)
    if line is None:
      undecodable += 1
      stats["undecodable"] += 1
      continue
    if not line.strip():
      continue  # blank lines are not records
    records += 1
    record = parse_json_line(line.removeprefix("\ufeff"), path, lineno)
    text = json_field(record, text_field)
    if not isinstance(text, str):
      keys = ", ".join(record) if isinstance(record, dict) else type(record).__name__
      raise CardjaxError(
          f"{path}:{lineno}: no string field {text_field!r} (has: {keys}); "
          "set the text_field option")
    if not text.strip():
      stats["empty"] += 1
      continue
    stats["examples"] += 1
    yield f"{rel}:{lineno}", {"text": text, "source": f"{rel}:{lineno}"}
  if records == 0 and not undecodable:
    stats["empty"] += 1  # an empty .jsonl file counts as one empty text


def _parquet_examples(path, rel, text_field, mode, stats):
  """Rows of a .parquet file, keyed by row number from 1 (as lines are); a null counts as an
  empty text."""
  rows, undecodable = 0, 0
  for row, raw in parquet_values(path, text_field):
    rows += 1
    text = None if raw is None else _decode(raw, mode, path, 0, row)
    if raw is not None and text is None:
      undecodable += 1
      stats["undecodable"] += 1
    elif text is None or not text.strip():
      stats["empty"] += 1
    else:
      stats["examples"] += 1
      yield f"{rel}:{row}", {"text": text, "source": f"{rel}:{row}"}
  if rows == 0:
    stats["empty"] += 1  # as an empty .jsonl file: one empty text


def file_examples(path: str, rel: str, text_field: str, on_decode_error: str, stats):
  """(key, {"text", "source"}) of one file, keyed by its relative path (and line); updates
  the `stats` Counter."""
  stats["files"] += 1
  if is_jsonl(path):
    yield from _jsonl_examples(path, rel, text_field, on_decode_error, stats)
    return
  if is_parquet(path):
    yield from _parquet_examples(path, rel, text_field, on_decode_error, stats)
    return
  text = _decode(file_bytes(path), on_decode_error, path)
  if text is None:
    stats["undecodable"] += 1
  elif not text.strip():
    stats["empty"] += 1
  else:
    stats["examples"] += 1
    yield rel, {"text": text.removeprefix("\ufeff"), "source": rel}


# Beam counters of a split's counts: namespace BEAM_COUNTERS/SPLIT, names as in metadata.json.
BEAM_COUNTERS = "cardjax.text_corpus"


def _beam_file_examples(path_rel, split: str, text_field: str, on_decode_error: str):
  """file_examples of one file on a Beam worker; its counts go to Beam's metrics."""
  from apache_beam.metrics import Metrics

  stats = collections.Counter()
  yield from file_examples(*path_rel, text_field, on_decode_error, stats)
  for name, value in stats.items():
    Metrics.counter(f"{BEAM_COUNTERS}/{split}", name).inc(value)


def beam_counts(pipeline_result, prefix: str = BEAM_COUNTERS) -> dict[str, dict[str, int]]:
  """{split: {files, examples, ...}} from the counters (namespace PREFIX/SPLIT) of a
  finished Beam build."""
  from apache_beam.metrics.metric import MetricsFilter

  found = collections.defaultdict(dict)
  counters = pipeline_result.metrics().query(MetricsFilter())["counters"]
  for counter in counters:
    namespace = counter.key.metric.namespace
    if namespace.startswith(prefix + "/"):
      split = namespace.split("/", 1)[1]
      found[split][counter.key.metric.name] = int(counter.committed or counter.attempted)
  return dict(found)


def check_beam_stored(builder, read: dict[str, int | None]) -> None:
  """Every example the Beam workers read (`read`: {split: count}, from their counters) was
  stored: so a runner that lost or repeated work fails the build, before its
  dataset_info.json is written (then nothing half-made is used), instead of leaving a
  short corpus."""
  for split, info in builder.info.splits.items():
    if read.get(split) != info.num_examples:
      raise CardjaxError(
          f"dataset {builder.name}: the Beam build stored {info.num_examples} examples of "
          f"split {split} but its workers read {read.get(split)}; the runner lost or "
          "repeated work: build again (the unfinished build is not used)")


def beam_examples(files, split: str, text_field: str, on_decode_error: str):
  """A Beam PTransform (pipeline -> (key, example)) of `files`: one file a work item, so
  the workers share the files; tfds' Beam writer then orders the records by key exactly as
  its single-process writer does."""
  import apache_beam as beam

  @beam.ptransform_fn
  def read_files(pipeline):
    return (pipeline
            | "Files" >> beam.Create(list(files))
            | "Spread" >> beam.Reshuffle()
            | "Examples" >> beam.FlatMap(_beam_file_examples, split, text_field,
                                         on_decode_error))

  return read_files()  # pylint: disable=no-value-for-parameter


class FileCorpus(tfds.core.GeneratorBasedBuilder, skip_registration=True):
  """Files -> {"text", "source"}; subclasses say which files (`_files`) and from where."""

  SUPPORTS_BEAM = True
  # Set by builders.build for a Beam build: the splits are then Beam PTransforms; the
  # per-split counts are Beam counters, stored in metadata.json as a local build's are.
  use_beam = False

  # 1.2.0: a build of 1.1.0 read a .parquet or .jsonl.gz file as one raw text; 1.3.0: one
  # of 1.2.0 read a .txt.gz file raw (or skipped it). A new version makes such a build be
  # made again rather than reused.
  VERSION = tfds.core.Version("1.3.0")
  RELEASE_NOTES = {"1.0.0": "First version.",
                   "1.1.0": "Example keys from relative paths: the same order in any folder.",
                   "1.2.0": "Reads .parquet, .jsonl.gz and .jsonl.zst files record by record.",
                   "1.3.0": "Decompresses one-text .gz / .zst files (.txt.gz); nested fields "
                            "(text_field a.b); corpus files in buckets."}
  TEXT_FIELD = "text"

  def _info(self) -> tfds.core.DatasetInfo:
    return tfds.core.DatasetInfo(
        builder=self,
        description=(self.__doc__ or "").strip(),
        features=tfds.features.FeaturesDict(
            {"text": tfds.features.Text(), "source": tfds.features.Text()}),
        metadata=tfds.core.MetadataDict(),  # per-split counts, filled while generating
    )

  def _files(self) -> list[tuple[str, str]]:
    raise NotImplementedError

  def _inputs(self) -> str:
    """The inputs in words, for error messages."""
    raise NotImplementedError

  def _examples(self, files, stats):
    cfg = self.builder_config
    text_field = getattr(cfg, "text_field", self.TEXT_FIELD)
    for path, rel in files:
      yield from file_examples(path, rel, text_field, cfg.on_decode_error, stats)

  def _split_generators(self, dl_manager):
    del dl_manager  # nothing to download
    files = {"train": [], "validation": []}
    for path, rel in self._files():
      val = in_validation(rel, self.builder_config.validation_percent)
      files["validation" if val else "train"].append((path, rel))
    probes = {s: functools.partial(self._examples, fs, collections.Counter())
              for s, fs in files.items() if fs}
    splits = nonempty_splits(probes)
    if not splits:
      raise CardjaxError(
          f"dataset {self.name}: no examples in {self._inputs()}; every file is empty "
          "(or was skipped as undecodable)")
    if self.use_beam:
      cfg = self.builder_config
      text_field = getattr(cfg, "text_field", self.TEXT_FIELD)
      return {s: beam_examples(files[s], s, text_field, cfg.on_decode_error) for s in splits}
    return {s: self._generate_examples(files[s], s) for s in splits}

  def _process_pipeline_result(self, pipeline_result) -> None:
    # A Beam build's counts, as a single-process build stores them.
    for split, counts in beam_counts(pipeline_result).items():
      self.info.metadata[split] = counts

  def _download_and_prepare(self, dl_manager, download_config) -> None:
    super()._download_and_prepare(dl_manager, download_config)
    if not self.use_beam:
      return
    check_beam_stored(self, {s: c.get("examples") for s, c in self.info.metadata.items()})

  def _generate_examples(self, files, split):
    stats = collections.Counter()
    yield from self._examples(files, stats)
    self.info.metadata[split] = dict(stats)
    level = 30 if stats["undecodable"] else 20  # WARNING when files were dropped
    LOG.log(level, "%s %s: %d examples from %d files; skipped %d empty, %d undecodable",
            self.name, split, stats["examples"], stats["files"], stats["empty"],
            stats["undecodable"])


class TextCorpus(FileCorpus):
  """Local text / code / JSONL / Parquet files ({"text", "source"}), split by path hash."""

  CONFIG_CLS = TextCorpusConfig

  def _files(self):
    return match_files(self.builder_config.paths)

  def _inputs(self):
    return f"the files matching {', '.join(self.builder_config.paths)}"
