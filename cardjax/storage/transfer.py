"""Copies between local disk and a bucket, for the libraries that only read or write local
files (safetensors, transformers, tokenizers, tensorboardX, orbax on s3://).

`local_copy(path)` gives a local folder or file with a bucket object's contents;
`local_output(path)` a local folder whose contents are uploaded when the block ends without
an error. For a local path both simply give the path itself. Folders are copied by
cardjax/storage/trees.py; a bucket's local copies that are kept live in its staging folder
(cardjax/storage/cache.py).
"""

from __future__ import annotations

import contextlib
import os
import shutil
import tempfile
from pathlib import Path

from cardjax.errors import CardjaxError
from cardjax.storage import trees
from cardjax.storage.cache import staging_dir
from cardjax.storage.paths import is_remote, resolve
from cardjax.storage.reach import checked_path


@contextlib.contextmanager
def local_copy(path: str | os.PathLike):
  """A local path holding `path` (a file or a folder): `path` itself when local, else a
  temporary copy, deleted after the block."""
  if not is_remote(path):
    yield Path(resolve(path))
    return
  remote = checked_path(path)
  with tempfile.TemporaryDirectory(prefix="cardjax-download-") as tmp:
    target = Path(tmp) / remote.name
    if remote.is_dir():
      trees.download(str(remote), target)
    elif remote.exists():
      trees.download_file(str(remote), target)
    else:
      yield target  # missing: the caller's own check names it
      return
    yield target


@contextlib.contextmanager
def local_output(path: str | os.PathLike):
  """A local folder to write into; for a bucket `path`, a temporary folder uploaded to it
  when the block ends without an error."""
  if not is_remote(path):
    yield Path(resolve(path))
    return
  with tempfile.TemporaryDirectory(prefix="cardjax-upload-") as tmp:
    yield Path(tmp)
    checked_path(path)  # credentials and bucket too: trees checks only the endpoint
    trees.upload(tmp, path)


def copy_file(source: str | os.PathLike, target: str | os.PathLike) -> None:
  """One file, from and to local disk or a bucket."""
  if not is_remote(source) and not is_remote(target):
    shutil.copyfile(resolve(source), resolve(target))
  else:
    checked_path(target).write_bytes(checked_path(source).read_bytes())


def cached_copy(path: str | os.PathLike) -> Path:
  """A local path holding `path`, kept (for what holds on to its folder, e.g. a tokenizer):
  `path` itself when local, else a copy in its staging folder (downloaded again when its
  files differ in size from the bucket's)."""
  if not is_remote(path):
    return Path(resolve(path))
  remote = checked_path(path)
  if not remote.exists():
    raise CardjaxError(f"{resolve(path)} does not exist")
  # Processes on one host (launch/local.sh's, serve beside eval) share this folder: a copy
  # lands whole by one rename, never by clearing the folder another process reads from.
  target = staging_dir(resolve(path)) / "copy" / remote.name
  target.parent.mkdir(parents=True, exist_ok=True)
  if remote.is_dir():
    trees.download(str(remote), target)
  else:
    trees.download_file(str(remote), target)
  return target
