"""A random-access source over a split of a bucket build that fetches shard files lazily.

    src = LazySource(info, "train", "gs://b/tfds/text_corpus/CFG/1.3.0", sizes, cache)
    src[i]   # what builder.as_data_source("train")[i] returns

Index i maps to (shard file, record) through tfds' own file instructions of the split (its
shard lengths; tfds slices such as train[:10%] and train+validation too). The first read in
a shard fetches the whole file into the bounded FileCache (cardjax/storage/file_cache.py);
a host reading a contiguous range of records fetches only the shards that range covers.
Records are decoded as tfds' ArrayRecord data source decodes them
(`features.deserialize_example_np`), so an example is the same either way.

Readers are per process and opened lazily; grain's read threads share them, and a source
pickled into a grain worker process opens its own. A reader keeps its file open, so a file
another process evicts stays readable; the reader is dropped when a later fetch sees the
file's name gone or replaced, which releases its disk space.
"""

from __future__ import annotations

import bisect
import itertools
import os
import threading
import time

from array_record.python import array_record_module
from tensorflow_datasets.core.data_sources import base

from cardjax.errors import CardjaxError
from cardjax.storage.file_cache import FileCache, touch

# As array_record's own data source opens shards for random access: no read-ahead.
_READER_OPTIONS = "readahead_buffer_size:0"
_BUFFER = 32768
TOUCH_EVERY_S = 5.0  # how often a read marks its shard used (mtime) for the LRU order


class LazySource:
  """Split `split` of the build described by `info` (a tfds DatasetInfo read from the
  cached metadata), its shards in bucket folder `folder` with sizes `sizes` ({file name:
  bytes}), fetched into `cache`."""

  def __init__(self, info, split: str, folder: str, sizes: dict[str, int], cache: FileCache):
    self.features, self.split, self.folder, self.cache = info.features, split, folder, cache
    # (shard file name, first record) per instruction; a slice skips into its first shard.
    self._parts = []
    for fi in base.file_instructions(info, split):
      name = os.path.basename(os.fspath(fi.filename))
      if name not in sizes:
        raise CardjaxError(f"{folder}/{name}: dataset_info.json names this shard but the "
                           "bucket folder does not hold it; build the dataset again")
      self._parts.append((name, fi.skip, fi.take))
    self.sizes = {name: sizes[name] for name, _, _ in self._parts}
    self._paths = {name: cache.path(f"{folder}/{name}") for name in self.sizes}
    self._ends = list(itertools.accumulate(take for _, _, take in self._parts))
    self._local_state()

  def _local_state(self) -> None:
    self._lock = threading.Lock()
    self._readers: dict[str, tuple[object, int]] = {}  # name: (reader, inode)
    self._touched: dict[str, float] = {}  # name: when this process last marked it used
    self._swept = 0.0

  def __getstate__(self):  # readers and locks stay in their process
    return {k: v for k, v in self.__dict__.items()
            if k not in ("_lock", "_readers", "_touched", "_swept")}

  def __setstate__(self, state):
    self.__dict__.update(state)
    self._local_state()

  def __len__(self) -> int:
    return self._ends[-1] if self._ends else 0

  def __repr__(self) -> str:
    return f"LazySource({self.folder}, split={self.split!r}, {len(self)} records)"

  def locate(self, index: int) -> tuple[str, int]:
    """(shard file name, record position in it) of record `index` of the split."""
    index = index.__index__()
    if not 0 <= index < len(self):
      raise IndexError(f"record {index} is outside the split's [0, {len(self)})")
    k = bisect.bisect_right(self._ends, index)
    name, skip, _ = self._parts[k]
    return name, skip + index - (self._ends[k - 1] if k else 0)

  def files_between(self, lo: int, hi: int) -> list[str]:
    """The shard files that hold records [lo, hi) of the split."""
    if hi <= lo:
      return []
    first, last = self.locate(lo)[0], self.locate(hi - 1)[0]
    names = [name for name, _, _ in self._parts]
    return names[names.index(first):names.index(last) + 1]

  def __getitem__(self, index):
    name, position = self.locate(index)
    record = self._reader(name).read([position])[0]
    return self.features.deserialize_example_np(record, decoders=None)

  def __getitems__(self, indices):
    """The examples of `indices`, one read per shard."""
    by_shard: dict[str, list[tuple[int, int]]] = {}
    for slot, index in enumerate(indices):
      name, position = self.locate(index)
      by_shard.setdefault(name, []).append((position, slot))
    out = [None] * len(indices)
    for name, wanted in by_shard.items():
      records = self._reader(name).read([p for p, _ in wanted])
      for (_, slot), record in zip(wanted, records):
        out[slot] = self.features.deserialize_example_np(record, decoders=None)
    return out

  def __iter__(self):
    for i in range(len(self)):
      yield self[i]

  def _reader(self, name: str):
    entry = self._readers.get(name)
    if entry is not None:
      now = time.monotonic()
      if now - self._touched.get(name, 0.0) > TOUCH_EVERY_S:
        self._touched[name] = now
        touch(self._paths[name])
        if now - self._swept > TOUCH_EVERY_S:
          with self._lock:
            self._drop_evicted(keep=name)
      return entry[0]
    # Threads may fetch different shards at once; the cache serialises those of one file.
    entry = self.cache.fetch(f"{self.folder}/{name}", self.sizes[name], _open)
    with self._lock:
      self._readers.setdefault(name, entry)
      self._touched[name] = time.monotonic()
      self._drop_evicted(keep=name)  # a fetch may have evicted; so may other processes
      return self._readers[name][0]

  def _drop_evicted(self, keep: str) -> None:
    """Forget readers (but `keep`'s, in use now) whose file another process evicted or
    replaced: once no read holds one, it closes and its disk space is freed."""
    self._swept = time.monotonic()
    for name, (_, inode) in list(self._readers.items()):
      if name == keep:
        continue
      try:
        gone = os.stat(self._paths[name]).st_ino != inode
      except FileNotFoundError:
        gone = True
      if gone:
        del self._readers[name]


def _open(path: str):
  """(ArrayRecord reader, inode) of a cached shard file."""
  reader = array_record_module.ArrayRecordReader(path, options=_READER_OPTIONS,
                                                 file_reader_buffer_size=_BUFFER)
  if not reader.ok():  # the constructor does not raise on a missing or unreadable file
    raise CardjaxError(f"{path}: cannot open this cached shard file")
  return reader, os.stat(path).st_ino


def fit_cache(source: LazySource, ranges: list[tuple[int, int]], cache_gb: float) -> None:
  """Size `source`'s cache for a host that reads records `ranges` of it, shuffled within
  each: with `cache_gb` 0, the files of those ranges plus the largest file (a shuffled
  read comes back to every file of its range, so a smaller cache fetches files again and
  again); otherwise `cache_gb` GB, with a warning when that is less than the host's share."""
  import logging

  log = logging.getLogger("cardjax.data")
  files = sorted({f for lo, hi in ranges for f in source.files_between(lo, hi)})
  share = sum(source.sizes[f] for f in files)
  total, largest = sum(source.sizes.values()), max(source.sizes.values())
  need = share + largest
  if cache_gb:
    source.cache.limit = int(cache_gb * 1e9)
    if source.cache.limit < need:
      log.warning("data.cache_gb=%g holds less than this host's share of %s (%s in %d "
                  "files, plus one file): shuffled reads will fetch files again; raise it or "
                  "set 0 (this host's share)", cache_gb, source.folder, _size(share),
                  len(files))
  else:
    source.cache.limit = need
  log.info("data: this host reads %d of the %d shard files of %s[%s] (%s of %s); local "
           "cache limit %s", len(files), len(source.sizes), source.folder, source.split,
           _size(share), _size(total), _size(source.cache.limit))


def _size(nbytes: int) -> str:
  return f"{nbytes / 1e9:.2f} GB" if nbytes >= 1e9 else f"{nbytes / 1e6:.1f} MB"
