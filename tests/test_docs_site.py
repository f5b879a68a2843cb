"""The documentation site: mkdocs.yml builds with --strict, and the pages render in Chromium.

Needs the docs extra (`pip install -e '.[docs]'`, which `make docs` installs) and, for the
browser check, a headless Chromium (Debian: `apt-get install chromium`); skipped without
them. The build takes about 10 s on 2 cores, the browser check about 15 s.
"""

from __future__ import annotations

import importlib.util
import os
import re
import subprocess
import sys
from pathlib import Path
from types import SimpleNamespace

import pytest

ROOT = Path(__file__).resolve().parents[1]
pytestmark = pytest.mark.docs  # run by `make docs`, after the site's own build


def _missing(module: str) -> bool:
  try:
    return importlib.util.find_spec(module) is None
  except ModuleNotFoundError:
    return True


MISSING = [m for m in ("mkdocs", "material", "mkdocstrings", "mkdocstrings_handlers.python")
           if _missing(m)]
needs_mkdocs = pytest.mark.skipif(
  bool(MISSING), reason=f"the docs extra is not installed ({', '.join(MISSING)}): "
  "pip install -e '.[docs]' (make docs)")


def _load(name: str, path: Path):
  spec = importlib.util.spec_from_file_location(name, path)
  module = importlib.util.module_from_spec(spec)
  spec.loader.exec_module(module)
  return module


@pytest.fixture(scope="module")
def site(tmp_path_factory) -> Path:
  out = tmp_path_factory.mktemp("docs") / "site"
  env = dict(os.environ, NO_MKDOCS_2_WARNING="1")
  run = subprocess.run([sys.executable, "-m", "mkdocs", "build", "--strict", "--quiet",
                        "-f", str(ROOT / "mkdocs.yml"), "-d", str(out)],
                       cwd=ROOT, env=env, capture_output=True, text=True, timeout=600)
  assert run.returncode == 0, f"mkdocs build --strict failed:\n{run.stdout}\n{run.stderr}"
  return out


@needs_mkdocs
def test_site_builds_strict(site: Path):
  docs = ROOT / "docs"
  pages = sorted(p.relative_to(docs).with_suffix(".html").as_posix()
                 for p in docs.rglob("*.md"))
  missing = [p for p in pages if not (site / p).is_file()]
  assert not missing, f"pages not built: {missing}"
  api = (site / "api" / "model.html").read_text(encoding="utf-8")
  assert 'id="cardjax.model.Decoder"' in api  # mkdocstrings rendered the docstrings
  home = (site / "index.html").read_text(encoding="utf-8")
  # Nothing from a CDN: no web fonts, the iframe-worker shim is the vendored one.
  assert "fonts.googleapis" not in home and "unpkg.com" not in home
  assert (site / "assets" / "javascripts" / "iframe-worker-shim.js").is_file()
  assert (site / "search" / "search_index.js").is_file()  # the offline plugin's index


@needs_mkdocs
def test_links_leaving_docs_point_at_the_repository(monkeypatch):
  hooks = _load("cardjax_mkdocs_hooks", ROOT / "tools" / "mkdocs_hooks.py")
  config = SimpleNamespace(docs_dir=str(ROOT / "docs"),
                           extra={"repo_links": "https://forge/x/{kind}/main/{path}"})
  monkeypatch.setitem(hooks._state, "config", config)
  monkeypatch.setitem(hooks._state, "errors", [])
  page = SimpleNamespace(file=SimpleNamespace(abs_src_path=str(ROOT / "docs" / "claims.md"),
                                              src_uri="claims.md"))
  assert hooks.rewrite("../results/README.md", page, image=False) == \
    "https://forge/x/blob/main/results/README.md"
  assert hooks.rewrite("../configs/", page, image=False) == "https://forge/x/tree/main/configs"
  assert hooks.rewrite("../README.md#set-up", page, image=False) == \
    "https://forge/x/blob/main/README.md#set-up"
  assert hooks.rewrite("training.md#x", page, image=False) is None  # mkdocs checks it
  assert hooks.rewrite("https://example.org/a", page, image=False) is None
  assert hooks._state["errors"] == []
  assert hooks.rewrite("../results/no_such_file.json", page, image=False) is None
  assert hooks.rewrite("../README.md#no-such-heading", page, image=False) is None
  assert hooks.rewrite("../../../etc/passwd", page, image=False) is None
  errors = hooks._state["errors"]
  assert len(errors) == 3 and all(e.startswith("claims.md: link '") for e in errors), errors
  assert "results/no_such_file.json" in errors[0] and "#no-such-heading" in errors[1]
  assert "outside the repository" in errors[2]
  with pytest.raises(Exception, match="3 broken link"):
    hooks.on_env(None, config, None)


@needs_mkdocs
def test_links_leaving_docs_travel_with_the_site(site: Path):
  """Without a forge to point at, a linked file is copied into the site and a linked
  folder gets a listing of its copied files: every link works offline."""
  claims = (site / "claims.html").read_text(encoding="utf-8")
  assert 'href="repo-files/results/claims/index.html"' in claims
  listing = (site / "repo-files" / "results" / "claims" / "index.html").read_text()
  linked = re.findall(r'href="([^"]+)"', listing)
  assert linked and all((site / "repo-files" / "results" / "claims" / h).is_file()
                        for h in linked)
  carried = re.findall(r'href="(repo-files/[^"#]+)', claims)
  assert carried and all((site / h).is_file() for h in carried)


@needs_mkdocs
def test_github_slugs_match_the_link_test():
  """The hook's anchors are tests/test_doc_links.py's (GitHub's), repeats included."""
  hooks = _load("cardjax_mkdocs_hooks", ROOT / "tools" / "mkdocs_hooks.py")
  links = _load("cardjax_test_doc_links", ROOT / "tests" / "test_doc_links.py")
  for page in [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]:
    assert hooks.markdown_anchors(page) == links.anchors(page), page
  ids: set[str] = set()
  assert [hooks.github_unique("a", ids) for _ in range(3)] == ["a", "a-1", "a-2"]


@needs_mkdocs
def test_pages_render_in_chromium(site: Path, tmp_path: Path):
  check = _load("cardjax_check_site", ROOT / "tools" / "check_site.py")
  browser = check.find_browser()
  if browser is None:
    pytest.skip("no headless Chromium on PATH (Debian: apt-get install chromium)")
  failures = check.check(site, tmp_path, browser)
  assert not failures, "\n".join(failures)
  for shot in ("index.png", "api_model.png", "search.png"):
    data = (tmp_path / shot).read_bytes()
    assert data[:8] == b"\x89PNG\r\n\x1a\n" and len(data) > 10_000, shot
