"""What a new user's machine looks like, for the tests that run cardjax as one would.

A copy of the repository as a clone has it (tracked files, and untracked ones git does not
ignore, so that uncommitted work is what is tested), in a new folder away from this
checkout, and an environment whose HOME, XDG_CACHE_HOME and CARDJAX_DATA_DIR are new empty
folders: no runs/, built datasets, caches or absolute paths of the machine the project is
developed on can make a first run pass here that fails elsewhere.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

from launch_helpers import one_device_flags

ROOT = Path(__file__).resolve().parents[1]


def copy_repository(dst: Path) -> Path:
  """The files a clone of this checkout holds, copied to `dst` (created)."""
  listed = subprocess.run(["git", "ls-files", "-z", "--cached", "--others", "--exclude-standard"],
                          cwd=ROOT, capture_output=True, check=True).stdout
  for name in filter(None, listed.decode().split("\0")):
    src = ROOT / name
    if src.is_file():  # a file deleted but not yet staged is listed too
      (dst / name).parent.mkdir(parents=True, exist_ok=True)
      shutil.copy2(src, dst / name)
  return dst


def fresh_environment(tmp: Path, bin_dir: Path | None = None) -> dict:
  """os.environ with HOME, XDG_CACHE_HOME and CARDJAX_DATA_DIR in new empty folders under
  `tmp`, one CPU device (what a user sees, not the tests' 8 simulated ones), and `bin_dir`
  (default: this venv's) first on PATH. jax's compilation cache folder of the test session
  is kept: it holds compiled programs only, never a file cardjax reads."""
  env = dict(os.environ)
  for name, folder in (("HOME", "home"), ("XDG_CACHE_HOME", "cache"),
                       ("CARDJAX_DATA_DIR", "data")):
    path = tmp / folder
    path.mkdir(parents=True, exist_ok=True)
    assert not any(path.iterdir()), path
    env[name] = str(path)
  env["XLA_FLAGS"] = one_device_flags(env.get("XLA_FLAGS", ""))
  env.pop("PYTHONPATH", None)
  bin_dir = bin_dir or Path(sys.executable).parent
  env["PATH"] = f"{bin_dir}{os.pathsep}{env.get('PATH', '')}"
  return env
