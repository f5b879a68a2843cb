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
data_dir, named as every bucket mirror is (cardjax/storage/cache.py). Both copies are
cardjax/storage/trees.py's. For a corpus larger than local disk, mount the bucket
(gcsfuse, mountpoint-s3) and give the mount as a local data_dir instead (docs/data.md).
"""

from __future__ import annotations

import logging
import os

from cardjax.errors import CardjaxError
from cardjax.storage import is_remote, trees
from cardjax.storage.cache import data_root, mirror_name
from cardjax.storage.errors import storage_errors
from cardjax.storage.reach import filesystem

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


def is_uploaded(folder: str) -> bool:
  fs = filesystem(folder)
  with storage_errors(folder, "list"):
    return fs.isfile(f"{folder}/{MARKER}")


def upload(local_build: str, folder: str) -> None:
  """Copy a finished local build folder to the bucket folder, the marker file last."""
  if not os.path.isfile(os.path.join(local_build, MARKER)):
    raise CardjaxError(f"{local_build} is not a finished build (no {MARKER}); build it again")
  log.info("uploading %s to %s", local_build, folder)
  trees.upload(local_build, folder, last=MARKER)


def fetch(folder: str, local_build: str) -> None:
  """Make `local_build` a complete copy of the bucket build `folder` (no-op when the copy
  already matches the bucket's files and sizes)."""
  sizes = trees.listing(folder)
  if MARKER not in sizes:
    raise CardjaxError(f"{folder} is not a finished build (no {MARKER}); build it again")
  trees.download(folder, local_build, sizes)
