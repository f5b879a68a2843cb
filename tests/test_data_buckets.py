"""text_corpus with its corpus and its data_dir in buckets (GCS and S3 emulators on loopback)
builds the records a local build does, and runs read them; bucket failures are one clear
error each."""

from __future__ import annotations

import os
import socket
import time

import fsspec
import pytest

from cardjax.config import base_config
from cardjax.data import builders
from cardjax.data.prepare import make_loader, prepare, tokenizer_dir
from cardjax.errors import CardjaxError
from cloud_emulators import emulated
from test_data_corpus_formats import write_corpus


def mixed_corpus(folder):
  """One corpus in every format, under nested folders."""
  write_corpus(folder / "txt", "txt")
  write_corpus(folder / "deep" / "gz", "a.jsonl.gz")
  write_corpus(folder / "deep" / "zst", "b.jsonl.zst")
  write_corpus(folder / "pq", "c.parquet")
  return folder


def all_records(data_dir, **options):
  """{split: every record, in stored order}."""
  out = {}
  for split in ("train", "validation") if options.get("validation_percent") else ("train",):
    src = builders.load_source("text_corpus", split, data_dir, **options)
    out[split] = [builders.decode(src[i]) for i in range(len(src))]
  return out


def upload_folder(local, uri):
  fs = fsspec.filesystem(uri.split("://")[0])
  fs.put(str(local), uri.split("://")[1], recursive=True)


@pytest.fixture
def cache(tmp_path, monkeypatch):
  monkeypatch.setenv("CARDJAX_CACHE", str(tmp_path / "cache"))
  return tmp_path / "cache"


def test_gs_corpus_into_gs_data_dir_builds_the_local_records(tmp_path, cache):
  corpus = mixed_corpus(tmp_path / "corpus")
  options = {"validation_percent": 30}
  local = builders.build("text_corpus", tmp_path / "tfds", paths=f"{corpus}/**/*.*", **options)
  expected = all_records(tmp_path / "tfds", paths=f"{corpus}/**/*.*", **options)
  assert all(expected.values()) and local.info.splits["train"].num_examples > 0
  with emulated("gs") as (_, root):
    upload_folder(corpus, f"{root}/corpus")
    paths = f"{root}/corpus/**/*.*"
    data_dir = f"{root}/tfds"
    builder = builders.build("text_corpus", data_dir, paths=paths, **options)
    folder = builders.location(builder, data_dir)
    assert folder.startswith(f"{data_dir}/text_corpus/")
    assert fsspec.filesystem("gs").isfile(f"{folder}/dataset_info.json")
    assert all_records(data_dir, paths=paths, **options) == expected
    # Another machine (an empty cache) downloads the build once and reads the same records.
    os.environ["CARDJAX_CACHE"] = str(tmp_path / "cache2")
    assert all_records(data_dir, paths=paths, **options) == expected
    assert any((tmp_path / "cache2").rglob("dataset_info.json"))
    # A damaged copy (here a truncated shard) is noticed by its size and downloaded again.
    shard = next((tmp_path / "cache2").rglob("*train.array_record-*"))
    shard.write_bytes(shard.read_bytes()[:-10])
    assert all_records(data_dir, paths=paths, **options) == expected
    # A build whose upload did not finish (no dataset_info.json) is not a build.
    fsspec.filesystem("gs").rm(f"{folder}/dataset_info.json")
    with pytest.raises(CardjaxError, match=r"is not built in gs://cardjax-test/tfds; run "
                                           r"`cardjax data build text_corpus"):
      builders.load_source("text_corpus", "train", data_dir, paths=paths, **options)


def test_s3_data_dir_with_tokenizer_feeds_make_loader(tmp_path, cache):
  corpus = mixed_corpus(tmp_path / "corpus")
  with emulated("s3") as (_, root):
    upload_folder(corpus, f"{root}/corpus")
    paths = f"{root}/corpus/**/*.*"
    config = base_config()
    config.data.dataset = "text_corpus"
    config.data.options = {"paths": paths, "validation_percent": 0}
    config.data.data_dir = f"{root}/tfds"
    config.data.tokenizer_vocab = 300
    config.data.seq_len = 32
    config.data.batch_size = 2
    config.model.vocab_size = 512
    builder, tokenizer = prepare(config)
    assert str(tokenizer_dir(config)).startswith(f"{root}/tfds/tokenizers/")
    assert fsspec.filesystem("s3").isfile(f"{tokenizer_dir(config)}/tokenizer.json")
    batch = next(iter(make_loader(config)))
    assert batch["tokens"].shape == (2, 32)
    src = builders.load_source("text_corpus", "train", config.data.data_dir,
                               **config.data.options.to_dict())
    assert len(src) == builder.info.splits["train"].num_examples
    local = builders.build("text_corpus", tmp_path / "tfds", paths=f"{corpus}/**/*.*",
                           validation_percent=0)
    assert local.info.splits["train"].num_examples == len(src)
    assert all_records(config.data.data_dir, paths=paths, validation_percent=0)["train"] == \
        all_records(tmp_path / "tfds", paths=f"{corpus}/**/*.*", validation_percent=0)["train"]


def test_bucket_glob_that_matches_nothing(tmp_path, cache):
  with emulated("gs") as (_, root):
    with pytest.raises(CardjaxError, match=r"no file matches gs://cardjax-test/none/\*\*/\*"
                                           r"\.parquet"):
      builders.build("text_corpus", tmp_path / "tfds", paths=f"{root}/none/**/*.parquet")


def test_unreachable_endpoint_fails_fast(tmp_path, cache, monkeypatch):
  with socket.socket() as s:  # a port nothing listens on
    s.bind(("127.0.0.1", 0))
    port = s.getsockname()[1]
  monkeypatch.setenv("STORAGE_EMULATOR_HOST", f"http://127.0.0.1:{port}")
  start = time.monotonic()
  with pytest.raises(CardjaxError, match=rf"gs://b/c/\*\.txt: cannot reach the gs:// endpoint "
                                         rf"http://127\.0\.0\.1:{port} "):
    builders.build("text_corpus", tmp_path / "tfds", paths="gs://b/c/*.txt")
  with pytest.raises(CardjaxError, match=r"gs://b/tfds.*: cannot reach the gs:// endpoint"):
    builders.load_source("text_corpus", "train", "gs://b/tfds", paths="/x/*.txt")
  assert time.monotonic() - start < 15


def test_missing_credentials(tmp_path, cache, monkeypatch):
  with emulated("s3") as (_, root):
    for key in ("AWS_ACCESS_KEY_ID", "AWS_SECRET_ACCESS_KEY", "AWS_PROFILE",
                "AWS_SESSION_TOKEN"):
      monkeypatch.delenv(key, raising=False)
    monkeypatch.setenv("AWS_SHARED_CREDENTIALS_FILE", str(tmp_path / "none"))
    monkeypatch.setenv("AWS_CONFIG_FILE", str(tmp_path / "none"))
    monkeypatch.setenv("AWS_EC2_METADATA_DISABLED", "true")
    import s3fs
    s3fs.S3FileSystem.clear_instance_cache()
    with pytest.raises(CardjaxError, match=r"s3://cardjax-test/c/\*\.txt: cannot list it, "
                                           r"access denied or no credentials .*AWS_ACCESS_KEY_ID"):
      builders.build("text_corpus", tmp_path / "tfds", paths=f"{root}/c/*.txt")
    s3fs.S3FileSystem.clear_instance_cache()
