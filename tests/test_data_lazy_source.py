"""A bucket build read lazily (cardjax/data/lazy_source.py) on the GCS and S3 emulators:
every record decodes as the whole copy's does, a reader of half the records fetches about
half the shard bytes, a small cache stays small, and two processes share one cache."""

from __future__ import annotations

import hashlib
import multiprocessing
import os
import pickle
import random
import threading

import grain
import pytest
import tensorflow_datasets as tfds
from absl import flags

from cardjax.data import bucket_builds, builders
from cardjax.data.lazy_source import LazySource
from cardjax.errors import ConfigError
from cardjax.storage import file_cache
from cardjax.storage.file_cache import FileCache
from cloud_emulators import emulated

NAME = "python_stdlib"
OPTIONS = {"max_files": 300, "validation_percent": 10}
NUM_SHARDS = 8


@pytest.fixture(scope="module")
def local_build(tmp_path_factory):
  """(data_dir, builder) of a local python_stdlib build written in NUM_SHARDS shards per
  split (tfds' num_shards; a build this small would otherwise be one shard)."""
  data_dir = tmp_path_factory.mktemp("tfds")
  builder = builders.make_builder(NAME, data_dir, **OPTIONS)
  builder.download_and_prepare(
      download_config=tfds.download.DownloadConfig(num_shards=NUM_SHARDS))
  return data_dir, builder


@pytest.fixture(scope="module", params=["gs", "s3"])
def bucket(request, local_build):
  """(bucket data_dir, {shard file: size} of the train split) with the build uploaded."""
  data_dir, builder = local_build
  with emulated(request.param) as (_, root):
    rel = os.path.relpath(builder.data_dir, data_dir).replace(os.sep, "/")
    bucket_builds.upload(os.fspath(builder.data_dir), f"{root}/tfds/{rel}")
    shards = {n: os.path.getsize(os.path.join(builder.data_dir, n))
              for n in os.listdir(builder.data_dir) if "-train.array_record-" in n}
    assert len(shards) == NUM_SHARDS
    yield f"{root}/tfds", shards


@pytest.fixture
def cache(tmp_path, monkeypatch):
  monkeypatch.setenv("CARDJAX_CACHE", str(tmp_path / "cache"))
  return tmp_path / "cache"


def digest(example: dict) -> str:
  return hashlib.sha1(repr(sorted(example.items())).encode()).hexdigest()


def fetched() -> tuple[int, int]:
  return file_cache.FETCHED["files"], file_cache.FETCHED["bytes"]


def load(data_dir, split="train", **kwargs):
  return builders.load_source(NAME, split, data_dir, **kwargs, **OPTIONS)


def test_every_index_decodes_as_the_whole_copy(bucket, local_build, cache):
  data_dir, _ = bucket
  _, builder = local_build
  files = 0
  for split in ("train", "validation", "train[10%:60%]", "train+validation"):
    src, whole = load(data_dir, split), builder.as_data_source(split=split)
    assert isinstance(src, LazySource) and len(src) == len(whole) > 0
    before = fetched()
    for i in range(len(src)):
      assert src[i] == whole[i], (split, i)
    files += fetched()[0] - before[0]
    order = random.Random(0).sample(range(len(src)), len(src))
    assert src.__getitems__(order) == [whole[i] for i in order]
  assert files == 2 * NUM_SHARDS  # each shard fetched once (the slice and sum: cached)
  # The build's mirror folder holds the metadata only; the shards are in the shard cache.
  mirror = bucket_builds.local_dir(data_dir)
  assert any(n == "dataset_info.json" for _, _, ns in os.walk(mirror) for n in ns)
  assert not [n for _, _, ns in os.walk(mirror) for n in ns if ".array_record-" in n]
  # A whole copy already in the cache (what `build` downloads) is read as it is.
  mirror_builder = builders.make_builder(NAME, data_dir, **OPTIONS)
  bucket_builds.fetch(builders.location(mirror_builder, data_dir),
                      os.fspath(mirror_builder.data_dir))
  before = fetched()
  src = load(data_dir)
  assert not isinstance(src, LazySource) and src[3] == builder.as_data_source("train")[3]
  assert fetched() == before


def test_half_reader_fetches_half_the_shards(bucket, tmp_path, monkeypatch, capsys):
  """Each of 2 hosts (here 2 caches) reading its contiguous half of the records fetches at
  most half the split's shard bytes plus one shard."""
  data_dir, shards = bucket
  total, largest = sum(shards.values()), max(shards.values())
  for host in range(2):
    monkeypatch.setenv("CARDJAX_CACHE", str(tmp_path / f"host{host}"))
    src = load(data_dir)
    half = len(src) // 2
    before = fetched()
    for i in range(host * half, len(src) if host else half):
      src[i]
    files, nbytes = (a - b for a, b in zip(fetched(), before))
    with capsys.disabled():
      print(f"\n{data_dir} host {host}/2: fetched {files} of {len(shards)} shard files, "
            f"{nbytes} of {total} bytes ({nbytes / total:.0%})")
    assert 0 < nbytes <= total / 2 + largest
    assert files <= NUM_SHARDS // 2 + 1


def test_small_cache_stays_under_its_limit(bucket, local_build, cache):
  data_dir, shards = bucket
  whole = local_build[1].as_data_source(split="train")
  largest = max(shards.values())
  limit_gb = 2.5 * largest / 1e9  # room for two shards
  src = load(data_dir, cache_gb=limit_gb)
  assert src.cache.limit == int(limit_gb * 1e9)
  before = fetched()
  order = list(range(len(src))) + random.Random(1).sample(range(len(src)), len(src))
  for i in order:
    assert src[i] == whole[i]
    _, used = src.cache.usage()
    assert used <= src.cache.limit + largest
    assert len(deleted_open_shards()) <= 1  # evicted files' readers were closed
  files = fetched()[0] - before[0]
  assert files > NUM_SHARDS  # shards were evicted and fetched again
  assert file_cache.FETCHED["refetched"] >= files - NUM_SHARDS
  kept = [n for _, _, ns in os.walk(cache) for n in ns if not n.startswith(".")
          and ".array_record-" in n]
  assert 0 < len(kept) <= 3


def deleted_open_shards() -> list[str]:
  """Shard files this process still holds open after their name was deleted."""
  out = []
  for fd in os.listdir("/proc/self/fd"):
    target = os.readlink(f"/proc/self/fd/{fd}") if os.path.islink(f"/proc/self/fd/{fd}") \
        else ""
    if ".array_record-" in target and target.endswith("(deleted)"):
      out.append(target)
  return out


def read_in_order(args) -> tuple[list[tuple[int, str]], int]:
  """A grain worker's reads: the pickled source, every index in a seeded random order;
  returns the digests and how many files this process fetched."""
  blob, seed = args
  src = pickle.loads(blob)
  order = random.Random(seed).sample(range(len(src)), len(src))
  return [(i, digest(src[i])) for i in order], file_cache.FETCHED["files"]


def test_two_processes_read_one_source(bucket, local_build, cache):
  data_dir, shards = bucket
  whole = local_build[1].as_data_source(split="train")
  expected = {i: digest(whole[i]) for i in range(len(whole))}
  src = load(data_dir, cache_gb=3.5 * max(shards.values()) / 1e9)  # evictions under way
  blob = pickle.dumps(src)
  with multiprocessing.get_context("spawn").Pool(2) as pool:
    results = pool.map(read_in_order, [(blob, 1), (blob, 2)])
  for got, _ in results:
    assert len(got) == len(expected) and dict(got) == expected
  assert all(files > 0 for _, files in results)
  assert sum(files for _, files in results) > NUM_SHARDS  # they evicted each other's files
  _, used = src.cache.usage()
  assert used <= src.cache.limit + 2 * max(shards.values())  # one file per downloader
  assert not [n for _, _, ns in os.walk(cache) for n in ns if ".part-" in n]


def test_threads_fetching_one_file_download_it_once(bucket, cache):
  data_dir, shards = bucket
  src = load(data_dir)
  name = min(shards)
  before = fetched()
  readers = []

  def read():
    readers.append(src.cache.fetch(f"{src.folder}/{name}", shards[name], os.path.getsize))

  threads = [threading.Thread(target=read) for _ in range(4)]
  for t in threads:
    t.start()
  for t in threads:
    t.join()
  assert readers == [shards[name]] * 4
  assert fetched() == (before[0] + 1, before[1] + shards[name])


def test_dead_download_and_changed_file_are_cleaned(tmp_path):
  cache = FileCache(tmp_path, 10**6)
  folder = tmp_path / "gs" / "b-0"
  folder.mkdir(parents=True)
  (folder / ".f-00000-of-00002.part-500-ab12").write_bytes(b"x" * 100)  # no one's download
  (folder / "f-00001-of-00002").write_bytes(b"y" * 300)
  files, used = cache.usage()
  assert used == 300 and [p for _, p, _ in files] == [str(folder / "f-00001-of-00002")]
  assert not (folder / ".f-00000-of-00002.part-500-ab12").exists()


def test_cache_limit_from_the_environment(monkeypatch):
  monkeypatch.delenv("CARDJAX_DATA_CACHE_GB", raising=False)
  assert bucket_builds.cache_limit_bytes() == 50 * 10**9
  monkeypatch.setenv("CARDJAX_DATA_CACHE_GB", "0.25")
  assert bucket_builds.cache_limit_bytes() == 250 * 10**6
  assert bucket_builds.cache_limit_bytes(2) == 2 * 10**9  # an argument wins
  monkeypatch.setenv("CARDJAX_DATA_CACHE_GB", "lots")
  with pytest.raises(ConfigError, match="CARDJAX_DATA_CACHE_GB='lots' is not a number"):
    bucket_builds.cache_limit_bytes()
  with pytest.raises(ConfigError, match="must be > 0 GB"):
    bucket_builds.cache_limit_bytes(0)


def source_name(example: dict) -> bytes:
  return example["source"]


def test_grain_worker_processes_read_a_range(bucket, local_build, cache):
  """What the pipeline does: a contiguous range, shuffled, read by grain worker processes
  (the source pickled into each), through a cache smaller than the range."""
  data_dir, shards = bucket
  whole = local_build[1].as_data_source(split="train")
  src = load(data_dir, cache_gb=2.5 * max(shards.values()) / 1e9)
  lo, hi = len(src) // 4, 3 * len(src) // 4
  flags.FLAGS.mark_as_parsed()  # grain reads absl flags (as cardjax/data/pipeline.py does)
  ds = grain.MapDataset.source(src)[lo:hi].shuffle(seed=0).map(source_name)
  got = list(ds.to_iter_dataset().mp_prefetch(grain.MultiprocessingOptions(num_workers=2)))
  assert sorted(got) == sorted(whole[i]["source"] for i in range(lo, hi))
