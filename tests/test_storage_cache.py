"""The one local cache of bucket mirrors (cardjax/storage/cache.py)."""

from __future__ import annotations

from cardjax.data import bucket_builds
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
