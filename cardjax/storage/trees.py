"""Folder trees copied between local disk and a bucket folder (gs://, s3://), file by file,
streamed through fsspec (put_file / get_file: no file is held in memory whole).

- `upload` can send one file after all others: a marker readers wait for (tfds'
  dataset_info.json), so a half-finished upload is never taken for a whole one.
- `download` writes into a temporary sibling folder, checks every size against the bucket's
  listing and only then renames it into place: a reader never sees a partial copy, and a
  copy that already matches the listing is not downloaded again. `download_file` lands
  one object the same way (a temporary sibling file, one rename).
Client failures are one CardjaxError each (cardjax/storage/errors.py).
"""

from __future__ import annotations

import logging
import os
import shutil
import tempfile

from cardjax.errors import CardjaxError
from cardjax.storage.errors import storage_errors
from cardjax.storage.paths import resolve
from cardjax.storage.reach import filesystem

log = logging.getLogger("cardjax.storage")


def listing(folder: str) -> dict[str, int]:
  """{path relative to `folder`, / separated: size} of every object under bucket folder
  `folder` (empty when there are none)."""
  folder = resolve(folder)
  fs = filesystem(folder)
  prefix = folder.split("://", 1)[1] + "/"
  with storage_errors(folder, "list"):
    found = fs.find(folder, detail=True)
  return {name[len(prefix):]: int(info["size"]) for name, info in found.items()
          if name.startswith(prefix) and info.get("type") == "file"}


def upload(local: str | os.PathLike, folder: str, last: str | None = None) -> None:
  """Every file under local folder `local` to the same relative path under bucket folder
  `folder`; `last` (a relative path among them) after all the others."""
  local, folder = os.fspath(local), resolve(folder)
  files = sorted(os.path.relpath(os.path.join(d, n), local).replace(os.sep, "/")
                 for d, _, names in os.walk(local) for n in names)
  if last is not None:
    if last not in files:
      raise CardjaxError(f"{local} has no {last}, the file its upload must end with; "
                         "finish writing the folder first")
    files = [f for f in files if f != last] + [last]
  fs = filesystem(folder)
  with storage_errors(folder, "write"):
    for rel in files:
      fs.put_file(os.path.join(local, rel), f"{folder}/{rel}")


def matches(local: str | os.PathLike, sizes: dict[str, int]) -> bool:
  """Whether local folder `local` holds each file of `sizes` at that size."""
  for rel, size in sizes.items():
    path = os.path.join(local, rel)
    if not os.path.isfile(path) or os.path.getsize(path) != size:
      return False
  return True


def download(folder: str, local: str | os.PathLike, sizes: dict[str, int] | None = None) -> None:
  """Make local folder `local` a copy of bucket folder `folder`, or of just the files `sizes`
  ({relative path: size}, from `listing`) when given; nothing is fetched when `local`
  already matches."""
  folder, local = resolve(folder), os.path.abspath(local)
  if sizes is None:
    sizes = listing(folder)
  if os.path.isdir(local) and matches(local, sizes):
    return
  log.info("downloading %s (%.1f MB) to %s", folder, sum(sizes.values()) / 1e6, local)
  parent = os.path.dirname(local)
  os.makedirs(parent, exist_ok=True)
  tmp = tempfile.mkdtemp(prefix=".download-", dir=parent)
  try:
    fs = filesystem(folder)
    with storage_errors(folder):
      for rel in sorted(sizes):
        target = os.path.join(tmp, rel)
        os.makedirs(os.path.dirname(target), exist_ok=True)
        fs.get_file(f"{folder}/{rel}", target)
    if not matches(tmp, sizes):
      raise CardjaxError(f"{folder}: the downloaded files differ in size from the bucket's "
                         "(the folder changed while downloading?); run again")
    if os.path.isdir(local) and matches(local, sizes):
      return  # another process on this machine finished the same copy meanwhile
    if os.path.isdir(local):  # a stale or partial copy: moved aside, then removed
      stale = tempfile.mkdtemp(prefix=".stale-", dir=parent)
      os.rename(local, os.path.join(stale, "old"))
      shutil.rmtree(stale, ignore_errors=True)
    try:
      os.rename(tmp, local)
    except OSError:
      if not (os.path.isdir(local) and matches(local, sizes)):
        raise  # not another process's identical copy
  finally:
    shutil.rmtree(tmp, ignore_errors=True)


def download_file(path: str, local: str | os.PathLike) -> None:
  """Bucket object `path` to local file `local`, streamed into a temporary sibling and
  renamed into place: a process reading `local` never sees a partial file."""
  path, local = resolve(path), os.path.abspath(local)
  os.makedirs(os.path.dirname(local), exist_ok=True)
  fd, tmp = tempfile.mkstemp(prefix=".download-", dir=os.path.dirname(local))
  os.close(fd)
  try:
    fs = filesystem(path)
    with storage_errors(path):
      fs.get_file(path, tmp)
    os.replace(tmp, local)
  finally:
    if os.path.exists(tmp):
      os.unlink(tmp)
