"""Every relative link in README.md, docs/ and results/ resolves, and docs/ holds no data.

A link is `[text](target)` or `![alt](target)` outside code; http(s) and mailto targets are
not fetched. A target names a file or folder relative to the page; `#anchor` must be a
heading of the target page (or of the page itself), slugged as GitHub does
(tools/markdown_anchors.py, which the site's build uses too).
"""

from __future__ import annotations

import re
from pathlib import Path
from urllib.parse import unquote

import pytest

from tools.markdown_anchors import anchors, prose_lines, slug

ROOT = Path(__file__).resolve().parents[1]
LINK = re.compile(r"!?\[(?:[^\[\]]|\[[^\]]*\])*\]\(\s*<?([^)\s>]+)>?(?:\s+\"[^\"]*\")?\s*\)")
INLINE_CODE = re.compile(r"`[^`\n]*`")


def pages() -> list[Path]:
  return ([ROOT / "README.md"] + sorted((ROOT / "docs").rglob("*.md"))
          + sorted((ROOT / "results").rglob("*.md")))


def links(page: Path):
  for n, line in prose_lines(page.read_text(encoding="utf-8")):
    for m in LINK.finditer(INLINE_CODE.sub("", line)):
      yield n, m.group(1)


def test_slug_follows_github():
  assert slug("Benchmark (`benchmarks/decode.py`)") == "benchmark-benchmarksdecodepy"
  assert slug("Why tau 0.95 at batch 1 stays near 1.0x") == "why-tau-095-at-batch-1-stays-near-10x"
  assert slug("Code: 3 training seeds (2026-12-02)") == "code-3-training-seeds-2026-12-02"


@pytest.mark.parametrize("page", pages(), ids=lambda p: str(p.relative_to(ROOT)))
def test_links_resolve(page: Path):
  broken = []
  for n, target in links(page):
    if re.match(r"^[a-z][a-z0-9+.-]*:", target):  # http:, https:, mailto:
      continue
    path, _, anchor = target.partition("#")
    dest = (page.parent / unquote(path)).resolve() if path else page
    where = f"{page.relative_to(ROOT)}:{n}: {target}"
    if not dest.exists():
      broken.append(f"{where} (no such file)")
    elif anchor and dest.suffix == ".md" and anchor not in anchors(dest):
      broken.append(f"{where} (no heading #{anchor})")
  assert not broken, "broken links:\n" + "\n".join(broken)


def test_docs_hold_no_data():
  # Pages and the pictures they show (docs/images/, drawn by tools/); measurements belong
  # in results/.
  docs = ROOT / "docs"
  data = [str(p.relative_to(ROOT)) for p in docs.rglob("*")
          if p.is_file() and p.suffix != ".md"
          and not (p.suffix == ".png" and p.is_relative_to(docs / "images"))]
  assert not data, f"data files belong in results/ (with an entry in results/README.md): {data}"
  pages = "".join(p.read_text(encoding="utf-8") for p in docs.rglob("*.md"))
  unused = [str(p.relative_to(ROOT)) for p in (docs / "images").rglob("*.png")
            if p.name not in pages]
  assert not unused, f"pictures no page shows: {unused}"


def test_results_index_names_every_file():
  index = (ROOT / "results" / "README.md").read_text(encoding="utf-8")
  results = ROOT / "results"

  def named(p) -> bool:
    # A checkpoint folder (orbax's hashed chunk names) is named as a whole: `folder/`.
    folders = [f for f in p.relative_to(results).parents if f.name]
    return p.name in index or any(f"`{f.as_posix()}/`" in index for f in folders)

  missing = [str(p.relative_to(results)) for p in results.rglob("*")
             if p.is_file() and p.suffix != ".md" and not named(p)]
  assert not missing, f"results/README.md does not name: {missing}"
