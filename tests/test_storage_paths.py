"""cardjax.storage: one rule for local paths and bucket URIs, checked on both emulators."""

import os
import re

import pytest
from cloud_emulators import emulated

from cardjax.errors import ConfigError
from cardjax.storage import as_path, is_remote, resolve, scheme


def test_resolve_keeps_uris_and_absolutises_local_paths(tmp_path, monkeypatch):
  monkeypatch.chdir(tmp_path)
  assert resolve("gs://bucket/run/") == "gs://bucket/run"
  assert resolve("S3://bucket/a/b") == "s3://bucket/a/b"
  assert resolve("run/x") == os.path.join(str(tmp_path), "run", "x")
  assert resolve("~/x") == os.path.join(os.path.expanduser("~"), "x")
  assert scheme("gs://b/x") == "gs" and scheme("/tmp/x") is None
  assert is_remote(as_path("s3://b/x") / "y") and not is_remote(tmp_path)
  # pathlib would make these a local folder named "gs:"; etils keeps the URI.
  assert str(as_path("gs://bucket/run") / "checkpoints") == "gs://bucket/run/checkpoints"


@pytest.mark.parametrize("bad, words", [("hdfs://nn/x", "unsupported storage scheme"),
                                        ("gs://", "gs://BUCKET/PATH"),
                                        ("s3:///x", "s3://BUCKET/PATH")])
def test_bad_uris_name_the_fix(bad, words):
  with pytest.raises(ConfigError, match=re.escape(words)):
    resolve(bad)


@pytest.mark.parametrize("kind", ["gs", "s3"])
def test_read_write_list_on_the_emulator(kind):
  with emulated(kind) as (_, root):
    folder = as_path(root) / "run" / "logs"
    folder.mkdir(parents=True, exist_ok=True)
    (folder / "a.jsonl").write_text('{"step": 1}\n')
    (folder / "b.bin").write_bytes(b"\x00\x01")
    assert sorted(p.name for p in folder.iterdir()) == ["a.jsonl", "b.bin"]
    assert (folder / "a.jsonl").read_text() == '{"step": 1}\n'
    assert [p.name for p in folder.glob("*.jsonl")] == ["a.jsonl"]
    assert not (folder / "missing").exists()
