"""Shared pieces of the tfds builders: option-named configs, stable hashes, split helpers."""

from __future__ import annotations

import dataclasses
import hashlib
import json
import logging
import os
from collections.abc import Callable, Iterable
from typing import ClassVar

import tensorflow_datasets as tfds

from cardjax.errors import ConfigError
from cardjax.storage import resolve

LOG = logging.getLogger("cardjax.data")

# Built-in tfds fields of a BuilderConfig; every other dataclass field is a user option.
_TFDS_FIELDS = frozenset(f.name for f in dataclasses.fields(tfds.core.BuilderConfig))

# tfds warns on every custom config (all of ours are) and on every probe of an unbuilt
# directory (load_source raises its own clear error); both are expected here, so drop them.
_NOISE = ("Using custom data configuration: %s", "Variant folder %s has no %s")


class _DropTfdsNoise(logging.Filter):
  def filter(self, record: logging.LogRecord) -> bool:
    return record.msg not in _NOISE


logging.getLogger("absl").addFilter(_DropTfdsNoise())


def stable_hash(text: str) -> int:
  """A hash that is the same in every process and on every machine (unlike hash())."""
  return int.from_bytes(hashlib.sha1(text.encode("utf-8")).digest()[:8], "big")


def in_validation(key: str, percent: int) -> bool:
  """Whether `key` falls in the validation share (`percent` of 100 hash buckets)."""
  return stable_hash(f"split:{key}") % 100 < percent


@dataclasses.dataclass(eq=False)
class OptionsConfig(tfds.core.BuilderConfig):
  """A BuilderConfig whose name is derived from its options.

  tfds stores a build under DATA_DIR/BUILDER/CONFIG_NAME/VERSION, so naming the config
  by a hash of every option means that different options never reuse a stale build.
  Subclasses add option fields (all with defaults) and may override `label`, `normalize`,
  `validate` and `identity`.
  """

  name: str = ""  # always replaced in __post_init__

  def __post_init__(self):
    self.normalize()
    self.validate()
    opts = json.dumps(self.identity(), sort_keys=True)
    digest = hashlib.sha1(opts.encode("utf-8")).hexdigest()[:10]
    self.name = f"{self.label()}_{digest}"
    self.description = "; ".join(f"{k}={v}" for k, v in self.identity().items())

  @classmethod
  def option_names(cls) -> list[str]:
    return [f.name for f in dataclasses.fields(cls) if f.name not in _TFDS_FIELDS]

  def options(self) -> dict:
    return {k: getattr(self, k) for k in self.option_names()}

  def identity(self) -> dict:
    """Everything that determines the built data (hashed into the name)."""
    return {k: list(v) if isinstance(v, tuple) else v for k, v in self.options().items()}

  def label(self) -> str:
    """A short readable prefix of the config name ([a-z0-9_] only)."""
    return "cfg"

  def normalize(self) -> None:
    """Canonicalise option values before hashing (e.g. make paths absolute)."""

  def validate(self) -> None:
    """Raise ConfigError for out-of-range option values."""

  def check_percent(self, field: str = "validation_percent") -> None:
    value = getattr(self, field)
    if not 0 <= value < 100:
      raise ConfigError(f"{field} must be in [0, 100), got {value}")

  def check_choice(self, field: str, choices: Iterable[str]) -> None:
    value, choices = getattr(self, field), tuple(choices)
    if value not in choices:
      raise ConfigError(f"{field} must be one of {', '.join(choices)}; got {value!r}")


def coerce_option(config_cls: type[OptionsConfig], builder: str, key: str, value):
  """Convert a CLI string to the option's type, judged by the field's default value."""
  field = next(f for f in dataclasses.fields(config_cls) if f.name == key)
  default = field.default if field.default is not dataclasses.MISSING else field.default_factory()
  if isinstance(default, tuple):
    if isinstance(value, os.PathLike):
      value = os.fspath(value)
    if isinstance(value, str):  # a CLI list: "a.txt,b/*.py"
      return tuple(p.strip() for p in value.split(",") if p.strip())
    return tuple(os.fspath(v) if isinstance(v, os.PathLike) else v for v in value)
  if not isinstance(value, str):
    return value
  if isinstance(default, bool):
    if value.lower() in ("1", "true", "yes"):
      return True
    if value.lower() in ("0", "false", "no"):
      return False
    raise ConfigError(f"option {key} of dataset {builder} must be true or false, got {value!r}")
  if isinstance(default, int):
    try:
      return int(value)
    except ValueError:
      raise ConfigError(
          f"option {key} of dataset {builder} must be an integer, got {value!r}") from None
  return value


def nonempty_splits(candidates: dict[str, Callable[[], Iterable]]) -> list[str]:
  """The splits whose example iterator yields at least one item.

  tfds refuses to write an empty split, so splits are declared only when they have data;
  each probe stops at the first example, so this is cheap on real corpora.
  """
  found = []
  for split, make in candidates.items():
    items = iter(make())
    try:
      if next(items, None) is not None:
        found.append(split)
    finally:
      getattr(items, "close", lambda: None)()  # close the files of a half-read generator
  return found


@dataclasses.dataclass(eq=False)
class PathsConfig(OptionsConfig):
  """Options of a builder that reads local files: patterns and a validation share."""

  BUILDER: ClassVar[str] = "this dataset"  # the builder's name, for error messages
  paths: tuple[str, ...] = ()  # files or glob patterns; `**` recurses
  validation_percent: int = 2

  def label(self) -> str:
    return f"files{len(self.paths)}_val{self.validation_percent}"

  def normalize(self) -> None:
    # Absolute, so the same pattern run from another directory is another dataset; bucket
    # URIs (gs://, s3://) are kept as they are.
    self.paths = tuple(resolve(p) for p in self.paths)

  def validate(self) -> None:
    if not self.paths:
      raise ConfigError(f"{self.BUILDER} needs paths=FILE_OR_GLOB[,FILE_OR_GLOB...]")
    self.check_percent()


class ConversationBuilder(tfds.core.GeneratorBasedBuilder, skip_registration=True):
  """Conversations stored as {"messages": JSON list of {role, content}, "answer": text}."""

  VERSION = tfds.core.Version("1.0.0")
  RELEASE_NOTES = {"1.0.0": "First version."}

  def _info(self) -> tfds.core.DatasetInfo:
    return tfds.core.DatasetInfo(
        builder=self,
        description=(self.__doc__ or "").strip(),
        features=tfds.features.FeaturesDict(
            {"messages": tfds.features.Text(), "answer": tfds.features.Text()}),
    )
