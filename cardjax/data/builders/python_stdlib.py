"""python_stdlib: the running interpreter's standard-library sources as a code corpus.

Every `*.py` under sysconfig's stdlib directory (tests included), minus `site-packages`,
`dist-packages` and `__pycache__`; one example per file, {"text", "source": relative path},
split by a stable hash of the relative path. The Python version and the stdlib directory
are part of the config name, so another interpreter never reuses this build.
"""

from __future__ import annotations

import dataclasses
import os
import platform
import sysconfig
from pathlib import Path

from cardjax.data.builders.common import OptionsConfig, stable_hash
from cardjax.data.builders.text_corpus import DECODE_MODES, FileCorpus
from cardjax.errors import ConfigError

EXCLUDED_DIRS = frozenset({"site-packages", "dist-packages", "__pycache__"})


def stdlib_root() -> str:
  return sysconfig.get_paths()["stdlib"]


@dataclasses.dataclass(eq=False)
class PythonStdlibConfig(OptionsConfig):
  validation_percent: int = 2
  max_files: int = 0  # 0 = all; else a deterministic hash-chosen subset (for tests)
  # A few stdlib test files are deliberately not UTF-8 (encoding tests): drop them.
  on_decode_error: str = "skip"

  def label(self) -> str:
    major, minor, _ = platform.python_version_tuple()
    return f"py{major}{minor}_files{self.max_files or 'all'}_val{self.validation_percent}"

  def identity(self) -> dict:
    return {**super().identity(), "python": platform.python_version(), "stdlib": stdlib_root()}

  def validate(self) -> None:
    self.check_percent()
    self.check_choice("on_decode_error", DECODE_MODES)
    if self.max_files < 0:
      raise ConfigError(f"max_files must be >= 0 (0 = all), got {self.max_files}")


def stdlib_files(max_files: int = 0) -> list[tuple[str, str]]:
  """Sorted (absolute path, relative path) of the stdlib sources (a subset if max_files)."""
  root = stdlib_root()
  files = []
  for dirpath, dirnames, filenames in os.walk(root):
    dirnames[:] = [d for d in dirnames if d not in EXCLUDED_DIRS]  # prune, don't descend
    for name in filenames:
      if name.endswith(".py"):
        path = os.path.join(dirpath, name)
        files.append((path, Path(os.path.relpath(path, root)).as_posix()))
  if max_files:
    # Salted differently from the split hash, so the subset is not biased to one split.
    files = sorted(files, key=lambda f: stable_hash(f"subset:{f[1]}"))[:max_files]
  return sorted(files, key=lambda f: f[1])


class PythonStdlib(FileCorpus):
  """The running Python's standard-library *.py sources ({"text", "source"})."""

  CONFIG_CLS = PythonStdlibConfig

  def _files(self):
    return stdlib_files(self.builder_config.max_files)

  def _inputs(self):
    return f"the standard library at {stdlib_root()}"
