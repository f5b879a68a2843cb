"""`cardjax serve` keeps its compiled programs in a persistent cache by default, so a
restart on the same machine loads its warm-up instead of compiling it again (its pools'
programs whole, without tracing them: serve/pool/stored.py)."""

import os

from serve_helpers import mars_run, post, start_server

from cardjax.serve.cli import default_compilation_cache


def entries(folder) -> set[str]:
  return {p.name for p in folder.iterdir()} if folder.is_dir() else set()


def serve_once(run, cache, request: bool = False):
  """Start a server (its warm-up runs before it answers /health), optionally answer one
  request, stop it; returns its output."""
  proc, url = start_server(run, "--batch-sizes", "1", "--chunk", "2", "--slots", "64",
                           "--warmup-width", "16", "--compilation-cache", str(cache))
  try:
    if request:
      status, _, _ = post(url, {"model": "run", "prompt": "alpha beta", "max_tokens": 3})
      assert status == 200
  finally:
    proc.kill()
    output = proc.stdout.read()
    proc.wait()
  return output


def test_a_restart_compiles_nothing_new_in_its_warm_up(tmp_path):
  run = mars_run(tmp_path, context=64)
  cache = tmp_path / "xla"
  output = serve_once(run, cache)
  assert f"compiled programs kept in {cache}" in output
  first, stored = entries(cache), entries(cache / "programs")
  assert first and stored, "the warm-up left no programs in the cache"
  assert f"0 loaded from {cache / 'programs'}, {len(stored)} compiled" in output
  again = serve_once(run, cache)
  assert entries(cache) == first  # every program of the second warm-up came from the cache
  assert entries(cache / "programs") == stored
  # ... whole: loaded, neither compiled nor traced
  assert f"{len(stored)} loaded from {cache / 'programs'}, 0 compiled" in again


def test_the_cache_can_be_turned_off(tmp_path):
  run = mars_run(tmp_path, context=64)
  output = serve_once(run, "", request=True)
  assert "compiled programs kept" not in output


def test_the_default_follows_jax_then_the_user_cache(monkeypatch, tmp_path):
  monkeypatch.setenv("JAX_COMPILATION_CACHE_DIR", str(tmp_path / "jax"))
  assert default_compilation_cache() == str(tmp_path / "jax")
  monkeypatch.delenv("JAX_COMPILATION_CACHE_DIR")
  monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "xdg"))
  assert default_compilation_cache() == os.path.join(tmp_path, "xdg", "cardjax", "xla")


def test_metrics_count_the_compilations_after_start_up(tmp_path):
  """/metrics' cardjax_compilations_total counts what compiles while requests wait (here,
  with no warm-up and no cache, the first request's programs)."""
  from serve_helpers import metric

  proc, url = start_server(mars_run(tmp_path, context=64), "--batch-sizes", "1", "--chunk",
                           "2", "--slots", "64", "--compilation-cache", "")
  try:
    assert metric(url, "cardjax_compilations_total") == 0
    status, _, _ = post(url, {"model": "run", "prompt": "alpha beta", "max_tokens": 3})
    assert status == 200
    assert metric(url, "cardjax_compilations_total") > 0
    assert metric(url, "cardjax_compile_seconds_total") > 0
  finally:
    proc.kill()
    proc.wait()
