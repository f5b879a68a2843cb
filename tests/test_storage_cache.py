"""The one local cache of bucket mirrors (cardjax/storage/cache.py) and the one tree copier
(cardjax/storage/trees.py), on the S3 emulator."""

from __future__ import annotations

import pytest
from cloud_emulators import emulated

from cardjax.data import bucket_builds
from cardjax.errors import CardjaxError
from cardjax.storage import trees
from cardjax.storage.cache import mirror_name, staging_dir


def test_cardjax_cache_moves_both_caches_and_staging_dir_only_staging(tmp_path, monkeypatch):
  monkeypatch.setenv("CARDJAX_CACHE", str(tmp_path / "cache"))
  monkeypatch.delenv("CARDJAX_STAGING_DIR", raising=False)
  uri = "gs://bucket/runs/a b"
  name = mirror_name(uri)
  assert name.startswith("gs/bucket_runs_a_b-") and mirror_name("gs://bucket/runs/a_b") != name
  assert staging_dir(uri) == tmp_path / "cache" / "staging" / name
  assert bucket_builds.local_dir(uri) == str(tmp_path / "cache" / "data" / name)
  monkeypatch.setenv("CARDJAX_STAGING_DIR", str(tmp_path / "shared"))
  assert staging_dir(uri + "/") == tmp_path / "shared" / name
  assert bucket_builds.local_dir(uri) == str(tmp_path / "cache" / "data" / name)


def test_upload_sends_the_marker_last_and_download_checks_the_copy(tmp_path, monkeypatch):
  local = tmp_path / "build"
  for rel in ("z.bin", "a/shard-0", "a/shard-1", "info.json"):
    (local / rel).parent.mkdir(parents=True, exist_ok=True)
    (local / rel).write_bytes(rel.encode() * 100)
  with emulated("s3") as (_, root):
    fs = trees.filesystem(root)  # fsspec's cached instance: the one trees uses
    sent = []
    put_file = fs.put_file
    monkeypatch.setattr(fs, "put_file", lambda lpath, rpath, **kw: (sent.append(rpath),
                                                                    put_file(lpath, rpath, **kw)))
    trees.upload(local, f"{root}/b", last="info.json")
    assert sent[-1] == f"{root}/b/info.json" and len(sent) == 4
    with pytest.raises(CardjaxError, match="has no missing.json, the file its upload must end"):
      trees.upload(local, f"{root}/c", last="missing.json")
    sizes = trees.listing(f"{root}/b")
    assert sizes == {rel: 100 * len(rel) for rel in ("a/shard-0", "a/shard-1", "info.json",
                                                     "z.bin")}
    trees.download(f"{root}/b", tmp_path / "copy")
    assert (tmp_path / "copy" / "a" / "shard-1").read_bytes() == b"a/shard-1" * 100
    (tmp_path / "copy" / "z.bin").write_bytes(b"short")  # a damaged copy is fetched again
    trees.download(f"{root}/b", tmp_path / "copy", sizes)
    assert (tmp_path / "copy" / "z.bin").read_bytes() == b"z.bin" * 100
    assert sorted(p.name for p in tmp_path.iterdir()) == ["build", "copy"]  # no temporaries


# Two processes of one host copying the same bucket folder and file, again and again (as
# launch/local.sh's processes do with a bucket tokenizer or init_from).
_COPIER = """
import sys
from cardjax.storage.transfer import cached_copy
for _ in range(15):
  folder = cached_copy(sys.argv[1])
  assert sorted(p.name for p in folder.iterdir()) == ["a.json", "b.bin"], folder
  assert (folder / "b.bin").read_bytes() == b"b" * 50000
  assert cached_copy(sys.argv[2]).read_bytes() == b"c" * 30000
"""


def test_processes_sharing_a_cached_copy_never_see_each_others_partial_copy(tmp_path):
  import os
  import subprocess
  import sys

  local = tmp_path / "tok"
  local.mkdir()
  (local / "a.json").write_text("{}")
  (local / "b.bin").write_bytes(b"b" * 50000)
  (tmp_path / "c.bin").write_bytes(b"c" * 30000)
  with emulated("s3") as (env, root):
    trees.upload(local, f"{root}/tok")
    trees.filesystem(root).put_file(str(tmp_path / "c.bin"), f"{root}/c.bin")
    env = {**os.environ, **env, "CARDJAX_CACHE": str(tmp_path / "cache")}
    env.pop("CARDJAX_STAGING_DIR", None)
    procs = [subprocess.Popen([sys.executable, "-c", _COPIER, f"{root}/tok", f"{root}/c.bin"],
                              env=env, stderr=subprocess.PIPE, text=True) for _ in range(2)]
    errors = [p.communicate(timeout=300)[1] for p in procs]
    assert [p.returncode for p in procs] == [0, 0], errors
