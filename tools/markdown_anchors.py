"""Markdown headings' anchors as GitHub makes them, for the link test
(tests/test_doc_links.py) and the site's hook (tools/mkdocs_hooks.py), so a link that works
on GitHub works on the site. Standard library only: the test runs without mkdocs.

GitHub's slug: a link's text only, lower case, every character but letters, digits, `_`,
`-` and spaces dropped, spaces to `-`; `-1`, `-2`, ... appended to repeats.
"""

from __future__ import annotations

import re
from pathlib import Path

FENCE = re.compile(r"^\s*(```|~~~)")
HEADING = re.compile(r"^#{1,6}\s+(.*?)\s*#*\s*$")


def prose_lines(text: str):
  """(line number, line) outside fenced code blocks."""
  fenced = False
  for n, line in enumerate(text.splitlines(), 1):
    if FENCE.match(line):
      fenced = not fenced
      continue
    if not fenced:
      yield n, line


def slug(heading: str) -> str:
  text = re.sub(r"\[([^\]]*)\]\([^)]*\)", r"\1", heading)  # a link's text only
  text = re.sub(r"<[^>]+>", "", text).strip().lower()
  text = re.sub(r"[^\w\- ]", "", text)
  return text.replace(" ", "-")


def anchors(page: Path) -> set[str]:
  """The heading anchors of a Markdown file, repeats numbered -1, -2."""
  seen: dict[str, int] = {}
  out = set()
  for _, line in prose_lines(page.read_text(encoding="utf-8")):
    m = HEADING.match(line)
    if not m:
      continue
    base = slug(m.group(1))
    n = seen.get(base, 0)
    seen[base] = n + 1
    out.add(base if n == 0 else f"{base}-{n}")
  return out
