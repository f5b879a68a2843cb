"""Dataset builds kept in a bucket (data_dir gs://... or s3://...), read from a local copy.

tfds 4.9.10 without TensorFlow and array_record 0.8.6 cannot use a bucket directly: the
ArrayRecord writer opens only local files ("open() failed: No such file or directory;
opening gs://..."), and reading shards from a bucket path does not return. So:

* a build is written to a local folder (the cache folder of that data_dir) and then
  uploaded, dataset_info.json last: tfds counts a build as prepared by that file, so a
  half-uploaded build is never taken for a finished one;
* reading a bucket build downloads its folder once into the cache (into a temporary
  folder, sizes checked, then renamed into place, so a reader never sees a partial copy)
  and reads it there.

The cache is $CARDJAX_CACHE/data (default ~/.cache/cardjax/data), one folder per bucket
data_dir, named as every bucket mirror is (cardjax/storage/cache.py). For a corpus larger
than local disk, mount the bucket (gcsfuse, mountpoint-s3) and give the mount as a local
data_dir instead (docs/data.md).
"""

from __future__ import annotations

import logging
import os
import shutil
import tempfile

from cardjax.data.files import filesystem, storage_errors
from cardjax.errors import CardjaxError
from cardjax.storage import is_remote
from cardjax.storage.cache import data_root, mirror_name

log = logging.getLogger("cardjax.data")
MARKER = "dataset_info.json"  # what tfds' is_prepared() looks for; uploaded last


def local_dir(data_dir: str) -> str:
  """Where builds of `data_dir` are written and read on this machine: the folder itself,
  or for a bucket its mirror folder in the data cache (cardjax/storage/cache.py)."""
  if not is_remote(data_dir):
    return data_dir
  return str(data_root() / mirror_name(data_dir))


def remote_folder(data_dir: str, local_build: str) -> str:
  """The bucket URI of the build folder `local_build` (NAME/CONFIG/VERSION)."""
  rel = os.path.relpath(local_build, local_dir(data_dir)).replace(os.sep, "/")
  return f"{data_dir}/{rel}"


def _listing(fs, folder: str) -> dict[str, int]:
  """{path relative to `folder`: size} of every file under a bucket folder."""
  prefix = folder.split("://", 1)[1].rstrip("/") + "/"
  found = fs.find(folder, detail=True)
  return {name[len(prefix):]: int(info["size"]) for name, info in found.items()
          if name.startswith(prefix) and info.get("type") == "file"}


def is_uploaded(folder: str) -> bool:
  fs = filesystem(folder)
  with storage_errors(folder, "list"):
    return fs.isfile(f"{folder}/{MARKER}")


def upload(local_build: str, folder: str) -> None:
  """Copy a finished local build folder to the bucket folder, the marker file last."""
  files = sorted(os.path.relpath(os.path.join(d, n), local_build).replace(os.sep, "/")
                 for d, _, names in os.walk(local_build) for n in names)
  if MARKER not in files:
    raise CardjaxError(f"{local_build} is not a finished build (no {MARKER}); build it again")
  files = [f for f in files if f != MARKER] + [MARKER]
  fs = filesystem(folder)
  log.info("uploading %d files of %s to %s", len(files), local_build, folder)
  with storage_errors(folder, "write"):
    for rel in files:
      fs.put_file(os.path.join(local_build, rel), f"{folder}/{rel}")


def _matches(local_build: str, sizes: dict[str, int]) -> bool:
  for rel, size in sizes.items():
    path = os.path.join(local_build, rel)
    if not os.path.isfile(path) or os.path.getsize(path) != size:
      return False
  return True


def fetch(folder: str, local_build: str) -> None:
  """Make `local_build` a complete copy of the bucket build `folder` (no-op when the copy
  already matches the bucket's files and sizes)."""
  fs = filesystem(folder)
  with storage_errors(folder, "list"):
    sizes = _listing(fs, folder)
  if MARKER not in sizes:
    raise CardjaxError(f"{folder} is not a finished build (no {MARKER}); build it again")
  if os.path.isdir(local_build) and _matches(local_build, sizes):
    return
  parent = os.path.dirname(local_build)
  os.makedirs(parent, exist_ok=True)
  tmp = tempfile.mkdtemp(prefix=".download-", dir=parent)
  try:
    log.info("downloading %s (%.1f MB) to %s", folder, sum(sizes.values()) / 1e6, local_build)
    with storage_errors(folder):
      for rel in sorted(sizes):
        target = os.path.join(tmp, rel)
        os.makedirs(os.path.dirname(target), exist_ok=True)
        fs.get_file(f"{folder}/{rel}", target)
    if not _matches(tmp, sizes):
      raise CardjaxError(f"{folder}: the downloaded files differ in size from the bucket's "
                         "(the build changed while downloading?); run again")
    if os.path.isdir(local_build) and _matches(local_build, sizes):
      return  # another process on this machine finished the same copy meanwhile
    if os.path.isdir(local_build):  # a stale or partial copy: moved aside, then removed
      stale = tempfile.mkdtemp(prefix=".stale-", dir=parent)
      os.rename(local_build, os.path.join(stale, "old"))
      shutil.rmtree(stale, ignore_errors=True)
    try:
      os.rename(tmp, local_build)
    except OSError:
      if not (os.path.isdir(local_build) and _matches(local_build, sizes)):
        raise  # not another process's identical copy
  finally:
    shutil.rmtree(tmp, ignore_errors=True)
