"""A byte-bounded cache of bucket files on local disk, shared by the processes of a machine.

    cache = FileCache(root, limit_bytes)
    reader = cache.fetch("gs://b/build/f-00003-of-00008", size, open_fn)

`fetch` downloads the object the first time it is asked for and returns `open_fn(local
path)`. Several processes (grain's worker processes, launch/local.sh's hosts) and threads
(grain's read threads) may use one cache folder at once; the rules that make that safe:

- A file lands whole: it is downloaded to a temporary `.NAME.part-SIZE-RANDOM`, its size
  checked against the bucket's, and renamed into place. A reader never sees a partial file.
- One download of a file at a time on a machine: it is downloaded and opened while holding
  an exclusive flock on `.NAME.lock`; a second process waits, then finds the file there.
- The cache stays within `limit_bytes`: before a download, with the folder's `.lock` held,
  the least recently used files (by mtime; `touch` marks a use) are deleted until the files
  there, the downloads in progress (their part names carry their sizes) and the new file
  fit. A file whose `.NAME.lock` someone holds (being downloaded or opened) is never
  deleted. When nothing more can go, the new file is fetched anyway: the cache then holds
  more than the limit by at most that file (one per concurrent download).
- Deleting a file another process has open is safe on POSIX: unlink removes the name, and
  the open file stays readable until it is closed. Its blocks stay allocated until then, so
  the disk holds at most the limit plus the files readers still have open; readers drop
  theirs when they see the name gone (cardjax/data/lazy_source.py).
- A part file whose `.NAME.lock` is free was left by a download that died: it is deleted.

Lock files are empty and never deleted (deleting one could let two processes lock two
different files of one name). Files fetched by this process are counted in FETCHED.
"""

from __future__ import annotations

import collections
import contextlib
import fcntl
import logging
import os
import secrets
import threading
import time

from cardjax.errors import CardjaxError
from cardjax.storage.cache import mirror_name
from cardjax.storage.errors import storage_errors
from cardjax.storage.reach import filesystem

log = logging.getLogger("cardjax.storage")

# Files and bytes this process downloaded into any FileCache (other processes count theirs);
# "refetched" counts files downloaded again after an eviction.
FETCHED: collections.Counter = collections.Counter()
_COUNTING = threading.Lock()  # grain's read threads download at once
_SEEN: set[str] = set()  # local paths this process fetched before
_PART = ".part-"
_LOCK = ".lock"


@contextlib.contextmanager
def _flock(path: str, blocking: bool = True):
  """An exclusive flock on `path` (created if missing); yields False when `blocking` is
  False and another open of the file holds it. Released when the block ends or the process
  dies, so a crash never leaves a file locked."""
  fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o644)
  try:
    try:
      fcntl.flock(fd, fcntl.LOCK_EX | (0 if blocking else fcntl.LOCK_NB))
    except BlockingIOError:
      yield False
      return
    yield True
  finally:
    os.close(fd)  # closing the last descriptor of this open releases the lock


class FileCache:
  """Bucket files under local folder `root`, at most `limit_bytes` of them (see above)."""

  def __init__(self, root: str | os.PathLike, limit_bytes: int):
    self.root, self.limit = os.path.abspath(root), int(limit_bytes)

  def path(self, uri: str) -> str:
    """The local path of bucket object `uri`: its folder's mirror name, then its name."""
    folder, name = uri.rsplit("/", 1)
    return os.path.join(self.root, mirror_name(folder), name)

  def fetch(self, uri: str, size: int, open_fn):
    """`open_fn(local path)` of bucket object `uri` (`size` bytes, from the bucket's
    listing), downloaded first unless a copy of that size is there. The file cannot be
    evicted between its download and `open_fn`."""
    path = self.path(uri)
    os.makedirs(os.path.dirname(path), exist_ok=True)
    with _flock(_lock_of(path)):
      if not _has(path, size):
        self._download(uri, path, size)
      opened = open_fn(path)
      touch(path)
      return opened

  def _download(self, uri: str, path: str, size: int) -> None:
    folder, name = os.path.split(path)
    part = os.path.join(folder, f".{name}{_PART}{size}-{secrets.token_hex(4)}")
    with _flock(os.path.join(self.root, _LOCK)):
      if os.path.exists(path):  # a copy of another size: the bucket's file changed
        os.unlink(path)
      self._make_room(size)
      open(part, "wb").close()  # the reservation other processes count
    start = time.monotonic()
    try:
      fs = filesystem(uri)
      with storage_errors(uri):
        fs.get_file(uri, part)
      got = os.path.getsize(part)
      if got != size:
        raise CardjaxError(f"{uri}: downloaded {got} bytes, the bucket listed {size} (the "
                           "build changed while reading?); run again")
      with _flock(os.path.join(self.root, _LOCK)):  # renamed while no one is counting
        os.replace(part, path)
    finally:
      if os.path.exists(part):
        os.unlink(part)
    with _COUNTING:
      FETCHED["files"] += 1
      FETCHED["bytes"] += size
      again = path in _SEEN
      _SEEN.add(path)
      FETCHED["refetched"] += again
      files, nbytes, refetched = FETCHED["files"], FETCHED["bytes"], FETCHED["refetched"]
    log.info("data cache: fetched %s (%.1f MB, %.1f s); this process fetched %d files, "
             "%.1f MB", uri, size / 1e6, time.monotonic() - start, files, nbytes / 1e6)
    if again and refetched in (1, 10, 100, 1000, 10000):
      log.warning("data cache: %d files fetched again after their eviction: the records "
                  "read (a host's range, shuffled) span more shard files than the cache "
                  "limit (%.1f GB) holds; raise it (CARDJAX_DATA_CACHE_GB) above this "
                  "host's share of the build", refetched, self.limit / 1e9)

  def _make_room(self, size: int) -> None:
    """Delete least recently used files until `size` more bytes fit (the folder's lock
    held by the caller)."""
    files, used = self.usage()
    for mtime, path, nbytes in sorted(files):
      if used + size <= self.limit:
        return
      with _flock(_lock_of(path), blocking=False) as free:
        if free:  # nobody is downloading or opening it
          os.unlink(path)
          used -= nbytes
          log.info("data cache: evicted %s (%.1f MB)", path, nbytes / 1e6)

  def usage(self) -> tuple[list[tuple[float, str, int]], int]:
    """([(mtime, path, bytes)] of the cached files, bytes of those files plus the
    downloads in progress); parts of dead downloads are deleted on the way."""
    files, used = [], 0
    for dirpath, _, names in os.walk(self.root):
      for name in names:
        path = os.path.join(dirpath, name)
        if name.startswith(".") and _PART in name:
          original = os.path.join(dirpath, name[1:name.rindex(_PART)])
          with _flock(_lock_of(original), blocking=False) as free:
            if free:  # its downloader died: no one holds the file's lock
              _unlink(path)
              continue
          used += int(name[name.rindex(_PART) + len(_PART):].split("-")[0])
        elif not name.startswith("."):
          try:
            stat = os.stat(path)
          except FileNotFoundError:
            continue
          files.append((stat.st_mtime, path, stat.st_size))
          used += stat.st_size
    return files, used


def touch(path: str) -> None:
  """Mark a use of cached file `path` (its mtime orders eviction)."""
  with contextlib.suppress(FileNotFoundError):
    os.utime(path)


def _lock_of(path: str) -> str:
  folder, name = os.path.split(path)
  return os.path.join(folder, f".{name}.lock")


def _has(path: str, size: int) -> bool:
  try:
    return os.path.getsize(path) == size
  except FileNotFoundError:
    return False


def _unlink(path: str) -> None:
  with contextlib.suppress(FileNotFoundError):
    os.unlink(path)
