"""Dataset builds kept in a bucket (data_dir gs://... or s3://...), read through a local cache.

tfds 4.9.10 without TensorFlow and array_record 0.8.6 cannot use a bucket directly: the
ArrayRecord writer opens only local files ("open() failed: No such file or directory;
opening gs://..."), and reading shards from a bucket path does not return. So:

* a build is written to a local folder (the cache folder of that data_dir) and then
  uploaded, dataset_info.json last: tfds counts a build as prepared by that file, so a
  half-uploaded build is never taken for a finished one;
* reading a bucket build (`open_split`) downloads its metadata (every file but the
  ArrayRecord shards) into the cache (into a temporary folder, sizes checked, then renamed
  into place, so a reader never sees a partial copy) and reads the split through a
  LazySource (cardjax/data/lazy_source.py): each shard file is fetched into a bounded
  shard cache the first time a record in it is read, so a host that reads a range of the
  records fetches only the shards of that range. A whole copy already in the cache (from
  `fetch`, which `build` uses) is read as it is.

The cache is $CARDJAX_CACHE/data (default ~/.cache/cardjax/data), one folder per bucket
data_dir, named as every bucket mirror is (cardjax/storage/cache.py); lazily fetched
shards live in its shards/ folder, at most `cache_limit_bytes()` of them for all builds
together (cardjax/storage/file_cache.py). Folder copies are cardjax/storage/trees.py's.
A mounted bucket (gcsfuse, mountpoint-s3) given as a local data_dir needs no cache at all
(docs/data.md).
"""

from __future__ import annotations

import logging
import os
import re

from cardjax.errors import CardjaxError, ConfigError
from cardjax.storage import is_remote, trees
from cardjax.storage.cache import data_root, mirror_name
from cardjax.storage.errors import storage_errors
from cardjax.storage.file_cache import FileCache
from cardjax.storage.reach import filesystem

log = logging.getLogger("cardjax.data")
MARKER = "dataset_info.json"  # what tfds' is_prepared() looks for; uploaded last
SHARD = re.compile(r"\.array_record-\d+-of-\d+$")  # NAME-SPLIT.array_record-00003-of-00008
CACHE_GB_VARIABLE = "CARDJAX_DATA_CACHE_GB"
DEFAULT_CACHE_GB = 50.0


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


def fetch_metadata(folder: str, local_build: str) -> dict[str, int]:
  """Make `local_build` a copy of the bucket build `folder` less its shard files (no-op when
  it already holds them, e.g. a whole copy); returns {file name: size} of the whole build."""
  sizes = trees.listing(folder)
  if MARKER not in sizes:
    raise CardjaxError(f"{folder} is not a finished build (no {MARKER}); build it again")
  trees.download(folder, local_build, {k: v for k, v in sizes.items() if not SHARD.search(k)})
  return sizes


def cache_limit_bytes(gb: float | None = None) -> int:
  """The shard cache's size limit: `gb`, else $CARDJAX_DATA_CACHE_GB, else 50 (GB, 1e9
  bytes)."""
  if gb is None:
    text = os.environ.get(CACHE_GB_VARIABLE, "").strip()
    try:
      gb = float(text) if text else DEFAULT_CACHE_GB
    except ValueError:
      raise ConfigError(f"{CACHE_GB_VARIABLE}={text!r} is not a number of GB") from None
  if not gb > 0:
    raise ConfigError(f"the data cache limit must be > 0 GB, got {gb}")
  return int(gb * 1e9)


def shard_cache(gb: float | None = None) -> FileCache:
  """The machine's cache of lazily fetched shard files, limited by `cache_limit_bytes(gb)`."""
  return FileCache(data_root() / "shards", cache_limit_bytes(gb))


def open_split(builder, split: str, folder: str, sizes: dict[str, int],
               cache_gb: float | None = None):
  """A random-access source of `split` of the bucket build `folder` ({file: size} `sizes`),
  `builder` reading its local metadata copy (fetch_metadata)."""
  from cardjax.data.lazy_source import LazySource

  # Every build here is ArrayRecord (make_builder sets it, and tfds refuses to open a build
  # of another format with it), and tfds' file instructions cover slices and sums of
  # splits, so every split reads lazily.
  if trees.matches(os.fspath(builder.data_dir), sizes):  # a whole copy is here already
    log.info("%s: reading the whole copy in %s", folder, builder.data_dir)
    return builder.as_data_source(split=split)
  return LazySource(builder.info, split, folder, sizes, shard_cache(cache_gb))
