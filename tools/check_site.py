"""Open the built documentation site in headless Chromium and check that pages render.

    make docs && python tools/check_site.py             # site/, screenshots in site/_check/
    python tools/check_site.py --site DIR --out DIR --file

The site is served on a loopback port (or opened from file:// with --file, as a reader
opening site/index.html would). For each page (by default the home page and one API page)
Chromium dumps the DOM after the page's scripts ran and takes a screenshot; the check wants
the page's title, the navigation with its links, the page's heading and a code block (an
API page also needs rendered API entries). Then it opens the search with a query (Material's
`?q=` parameter) from file:// and wants results: the search index is the site's own,
nothing is fetched from the network. Exits 1 with the failures listed (2: no Chromium or no
site); the screenshots stay either way.
"""

from __future__ import annotations

import argparse
import contextlib
import functools
import html
import http.server
import os
import re
import shutil
import subprocess
import sys
import tempfile
import threading
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
BROWSERS = ("chromium", "chromium-browser", "google-chrome", "google-chrome-stable")
# page -> (what its title must contain, extra markers its DOM must hold)
PAGES = {
  "index.html": ("cardjax", ()),
  "api/model.html": ("cardjax.model", ('class="doc doc-heading"',)),
}
SEARCH_QUERY = "mars"


def find_browser(explicit: str | None = None) -> str | None:
  if explicit:
    return shutil.which(explicit) or (explicit if Path(explicit).exists() else None)
  return next((p for p in map(shutil.which, BROWSERS) if p), None)


class _Quiet(http.server.SimpleHTTPRequestHandler):
  def log_message(self, *args):
    pass


@contextlib.contextmanager
def serve(site: Path):
  """The site on http://127.0.0.1:<free port>/ for the duration of the block."""
  handler = functools.partial(_Quiet, directory=str(site))
  server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), handler)
  thread = threading.Thread(target=server.serve_forever, daemon=True)
  thread.start()
  try:
    yield f"http://127.0.0.1:{server.server_address[1]}/"
  finally:
    server.shutdown()
    server.server_close()


def chromium(browser: str, profile: Path, *args: str, timeout: float = 60) -> str:
  cmd = [browser, "--headless", "--disable-gpu", "--no-first-run", "--no-default-browser-check",
         "--disable-extensions", "--disable-dev-shm-usage", "--hide-scrollbars",
         "--force-device-scale-factor=1", f"--user-data-dir={profile}", *args]
  if hasattr(os, "geteuid") and os.geteuid() == 0:
    cmd.insert(1, "--no-sandbox")  # Chromium refuses to run as root with its sandbox
  out = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout)
  if out.returncode != 0:
    raise RuntimeError(f"{' '.join(cmd)} exited {out.returncode}:\n{out.stderr[-2000:]}")
  return out.stdout


def dom_problems(dom: str, title_has: str, markers=()) -> list[str]:
  """What a rendered page lacks: title, navigation, heading, code block, markers."""
  problems = []
  title = re.search(r"<title>(.*?)</title>", dom, re.S)
  title = html.unescape(title.group(1)).strip() if title else ""
  if title_has not in title:
    problems.append(f"title {title!r} lacks {title_has!r}")
  nav = dom.find('<nav class="md-nav md-nav--primary')
  if nav < 0 or len(re.findall(r'class="md-nav__link[ "]', dom[nav:])) < 5:
    problems.append("no primary navigation with its links")
  if not re.search(r'<nav class="md-tabs"', dom):
    problems.append("no navigation tabs")
  if not re.search(r"<h1[ >]", dom):
    problems.append("no <h1> heading")
  if not re.search(r"<pre[^>]*>.*?<code", dom, re.S):
    problems.append("no code block (<pre><code>)")
  problems += [f"no {m}" for m in markers if m not in dom]
  return problems


def check(site: Path, out: Path, browser: str, use_file: bool = False,
          size: str = "1280,1600") -> list[str]:
  """Checks PAGES and the search; returns the failures (empty: all rendered)."""
  out.mkdir(parents=True, exist_ok=True)
  failures = []
  with contextlib.ExitStack() as stack:
    base = site.resolve().as_uri() + "/" if use_file else stack.enter_context(serve(site))
    profile = Path(stack.enter_context(tempfile.TemporaryDirectory(prefix="check-site-")))
    for page, (title_has, markers) in PAGES.items():
      if not (site / page).is_file():
        failures.append(f"{page}: not in {site}")
        continue
      url = base + page
      dom = chromium(browser, profile, "--virtual-time-budget=5000", "--dump-dom", url)
      failures += [f"{page}: {p}" for p in dom_problems(dom, title_has, markers)]
      shot = out / (page.replace("/", "_").removesuffix(".html") + ".png")
      chromium(browser, profile, f"--window-size={size}", "--virtual-time-budget=5000",
               f"--screenshot={shot}", url)
      if not shot.is_file() or shot.stat().st_size < 10_000:
        failures.append(f"{page}: no screenshot at {shot}")
      else:
        print(f"{page}: rendered, screenshot {shot}")
    # Search from file:// (no server, no network): the offline plugin's inlined index and
    # the vendored iframe-worker shim. (Over http the search runs in a web worker, whose
    # work headless Chromium's virtual time does not wait for.)
    url = f"{site.resolve().as_uri()}/index.html?q={SEARCH_QUERY}"
    dom = chromium(browser, profile, "--virtual-time-budget=8000", "--dump-dom", url)
    hits = len(re.findall(r'class="md-search-result__item', dom))
    if hits == 0:
      failures.append(f"search for {SEARCH_QUERY!r} from file://: no results")
    else:
      print(f"search for {SEARCH_QUERY!r} from file://: {hits} results")
    chromium(browser, profile, f"--window-size={size}", "--virtual-time-budget=8000",
             f"--screenshot={out / 'search.png'}", url)
  return failures


def main(argv=None) -> int:
  p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
  p.add_argument("--site", type=Path, default=ROOT / "site", help="the built site (make docs)")
  p.add_argument("--out", type=Path, default=None,
                 help="folder for the screenshots (default: SITE/_check)")
  p.add_argument("--file", action="store_true", help="open file:// URLs instead of a server")
  p.add_argument("--browser", default=None, help="Chromium's executable (default: on PATH)")
  p.add_argument("--window-size", default="1280,1600", help="screenshot size, W,H")
  args = p.parse_args(argv)
  browser = find_browser(args.browser)
  if browser is None:
    print(f"no Chromium found ({', '.join(BROWSERS)}); on Debian: apt-get install chromium",
          file=sys.stderr)
    return 2
  if not (args.site / "index.html").is_file():
    print(f"{args.site}/index.html is missing: build the site first (make docs)",
          file=sys.stderr)
    return 2
  failures = check(args.site, args.out or args.site / "_check", browser, args.file,
                   args.window_size)
  for f in failures:
    print(f"FAIL {f}", file=sys.stderr)
  return 1 if failures else 0


if __name__ == "__main__":
  sys.exit(main())
