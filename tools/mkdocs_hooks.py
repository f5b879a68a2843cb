"""mkdocs hook (mkdocs.yml `hooks:`): links from docs/ pages to files outside docs/.

The pages are written for GitHub, so they link the repository's raw results, benchmarks and
configs with relative paths (`../results/decode/bench.json`). mkdocs only knows docs/, so
such a link would be a warning under `--strict`. This hook resolves every relative link of
a page before mkdocs does:
- a link (`<a href>`) to a file elsewhere in the repository is copied into the site (under
  `repo-files/`, a folder as its files beside a generated listing), so the site is whole
  offline; when `extra.repo_links` is set (a template with `{kind}`: blob for a file, tree
  for a folder, and `{path}`: the path in the repository) links point at the forge instead;
- an image (`<img src>`) is always copied into the site, so it shows offline;
- a target that does not exist, or lies outside the repository, or an `#anchor` that is no
  heading of a Markdown target (GitHub's slugs: tools/markdown_anchors.py, the link test's rule) is
  an error naming the page and the link, and the build fails after every page was read.
Links inside docs/ are left to mkdocs (its `validation:` settings, anchors included).

It also adds tools/site_assets/ to the site (assets/javascripts/): the iframe-worker shim
that lets search run from file://, which Material's offline plugin would otherwise load
from a CDN (mkdocs.yml names it in extra.polyfills).
"""

from __future__ import annotations

import html
import importlib.util
import logging
import posixpath
from pathlib import Path
from urllib.parse import quote, unquote, urlsplit

import markdown.extensions.toc
from markdown import Extension
from markdown.treeprocessors import Treeprocessor
from mkdocs.exceptions import PluginError
from mkdocs.structure.files import File, InclusionLevel

REPO = Path(__file__).resolve().parents[1]


def _load_anchors():
  """tools/markdown_anchors.py, the link test's slug rule: mkdocs loads this hook by path,
  without the repository on sys.path."""
  spec = importlib.util.spec_from_file_location(
      "cardjax_markdown_anchors", Path(__file__).with_name("markdown_anchors.py"))
  module = importlib.util.module_from_spec(spec)
  spec.loader.exec_module(module)
  return module


markdown_anchors = _load_anchors().anchors
COPIED = "repo-files"  # where images from outside docs/ land in the site
ASSETS = Path(__file__).resolve().parent / "site_assets"
log = logging.getLogger("mkdocs.hooks.repo_links")

_state: dict = {"page": None, "files": None, "config": None, "errors": []}


def github_unique(id: str, ids, counters=None) -> str:  # noqa: A002 (toc.unique's names)
  """toc's `unique` with GitHub's suffixes for repeated headings (-1, -2; toc's are _1)."""
  if id in ids or not id:
    n = 1
    while f"{id}-{n}" in ids:
      n += 1
    id = f"{id}-{n}"
  ids.add(id)
  return id


class _RepoLinks(Treeprocessor):
  """Runs before mkdocs' own relative-path processor (priority 0) on each page."""

  def run(self, root):
    page = _state["page"]
    if page is None or not page.file.abs_src_path:
      return None
    for el in root.iter():
      key = {"a": "href", "img": "src"}.get(el.tag)
      if key and el.get(key):
        new = rewrite(el.get(key), page, image=el.tag == "img")
        if new is not None:
          el.set(key, new)
    return None


class _RepoLinksExtension(Extension):
  def extendMarkdown(self, md):  # noqa: N802 (Markdown's name)
    md.treeprocessors.register(_RepoLinks(md), "cardjax_repo_links", 1)


def rewrite(url: str, page, image: bool) -> str | None:
  """The new URL of a link that leaves docs/, or None to leave it to mkdocs."""
  parts = urlsplit(url)
  if parts.scheme or parts.netloc or not parts.path or url.startswith(("/", "\\")):
    return None
  config = _state["config"]
  docs = Path(config.docs_dir).resolve()
  source = Path(page.file.abs_src_path)
  target = (source.parent / unquote(parts.path)).resolve()
  if target == docs or docs in target.parents:
    return None  # inside docs/: mkdocs' own checks
  where = f"{page.file.src_uri}: link '{url}'"
  if target != REPO and REPO not in target.parents:
    return _error(f"{where} points outside the repository ({target})")
  if not target.exists():
    return _error(f"{where}: no such file in the repository "
                  f"({target.relative_to(REPO).as_posix()})")
  rel = target.relative_to(REPO).as_posix()
  if parts.fragment and target.suffix == ".md" and parts.fragment not in markdown_anchors(target):
    return _error(f"{where}: {rel} has no heading #{parts.fragment}")
  template = config.extra.get("repo_links")
  if image or not template:
    # No forge to point at (or an image, which must show offline): the file travels with
    # the site, so every link works from a local build too.
    new = (_carry(target, rel, page) if target.is_file()
           else _folder_into_site(target, rel, page))
    return new + (f"#{parts.fragment}" if parts.fragment and target.is_file()
                  and target.suffix != ".md" else "")
  new = template.format(kind="tree" if target.is_dir() else "blob", path=quote(rel))
  return new + (f"?{parts.query}" if parts.query else "") + (
    f"#{parts.fragment}" if parts.fragment else "")


class _Carried(File):
  """A repository file copied into the site as it is: never rendered as a page (a .md) or
  as a template (a .json or .html), which mkdocs would do to such files in docs/."""

  def is_documentation_page(self) -> bool:
    return False

  def is_static_page(self) -> bool:
    return False


def _carry(target: Path, rel: str, page, content: str | None = None) -> str:
  """The file (or generated `content`) added to the site as repo-files/<rel>; its URL
  from `page`."""
  files, config = _state["files"], _state["config"]
  src_uri = f"{COPIED}/{rel}"
  if files.get_file_from_path(src_uri) is None:
    source = {"content": content} if content is not None else {"abs_src_path": str(target)}
    files.append(_Carried.generated(config, src_uri, inclusion=InclusionLevel.INCLUDED,
                                    **source))
  return posixpath.relpath(src_uri, posixpath.dirname(page.file.src_uri) or ".")


def _folder_into_site(target: Path, rel: str, page) -> str:
  """A linked folder: its files carried into the site beside a generated listing."""
  names = []
  for path in sorted(p for p in target.rglob("*") if p.is_file()):
    names.append(path.relative_to(target).as_posix())
    _carry(path, f"{rel}/{names[-1]}", page)
  items = "".join(f'<li><a href="{quote(n)}">{html.escape(n)}</a></li>' for n in names)
  listing = (f"<!doctype html><meta charset='utf-8'><title>{html.escape(rel)}/</title>"
             f"<h1>{html.escape(rel)}/</h1><ul>{items}</ul>\n")
  return _carry(target, f"{rel}/index.html", page, content=listing)


def _error(message: str) -> None:
  """Logs the broken link and keeps it for on_env, which fails the build."""
  log.error(message)
  _state["errors"].append(message)
  return None


# mkdocs hook events


def on_config(config):
  _state.update(config=config, errors=[], page=None)
  # The pages' #anchors are GitHub's (mkdocs.yml sets toc's slugify to pymdownx's GitHub
  # slugs); repeated headings too, so that mkdocs' anchor validation reads them the same.
  markdown.extensions.toc.unique = github_unique
  config.markdown_extensions.append(_RepoLinksExtension())
  return config


def on_files(files, config):
  _state["files"] = files
  for asset in sorted(ASSETS.glob("*.js")):
    files.append(File.generated(config, f"assets/javascripts/{asset.name}",
                                abs_src_path=str(asset), inclusion=InclusionLevel.INCLUDED))
  return files


def on_page_markdown(markdown, page, config, files):
  _state.update(page=page, files=files)
  return markdown


def on_page_content(html, page, config, files):
  _state["page"] = None
  return html


def on_env(env, config, files):
  errors = _state["errors"]
  if errors:
    raise PluginError(f"{len(errors)} broken link(s) to files outside docs/:\n  "
                      + "\n  ".join(errors))
  return env


def on_shutdown():
  _state.update(page=None, files=None, config=None, errors=[])

