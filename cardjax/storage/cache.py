"""cardjax's local cache on this machine, and the one name of a bucket URI's local mirror.

Everything cardjax keeps locally for a bucket lives under one root, $CARDJAX_CACHE (default
~/.cache/cardjax):

- staging/ : bucket runs' local copies (s3:// checkpoints, metrics, downloaded HF folders
  and tokenizers). $CARDJAX_STAGING_DIR moves this part alone: the hosts of a multi-host
  s3:// job must share it (docs/storage.md), the data cache need not be shared.
- data/    : dataset builds of bucket data_dirs (cardjax/data/bucket_builds.py).

In both, a bucket folder's mirror is `mirror_name(uri)`.
"""

from __future__ import annotations

import hashlib
import os
from pathlib import Path

from cardjax.storage.paths import resolve


def cache_root() -> Path:
  """$CARDJAX_CACHE, else ~/.cache/cardjax."""
  root = os.environ.get("CARDJAX_CACHE") or os.path.join("~", ".cache", "cardjax")
  return Path(os.path.abspath(os.path.expanduser(root)))


def staging_root() -> Path:
  """$CARDJAX_STAGING_DIR, else the cache root's staging/."""
  root = os.environ.get("CARDJAX_STAGING_DIR")
  return Path(os.path.abspath(os.path.expanduser(root))) if root else cache_root() / "staging"


def data_root() -> Path:
  """Where dataset builds of bucket data_dirs are written and read: the cache root's data/."""
  return cache_root() / "data"


def mirror_name(uri: str) -> str:
  """The relative folder that mirrors bucket folder `uri` under a cache root: readable
  (SCHEME/BUCKET_PATH, characters a file system may refuse replaced by _) and unique (a hash
  of the whole URI, so that two URIs never share one)."""
  uri = resolve(uri)
  name, rest = uri.split("://", 1)
  digest = hashlib.sha1(uri.encode("utf-8")).hexdigest()[:12]
  readable = "".join(c if c.isalnum() or c in "-." else "_" for c in rest)[:80]
  return f"{name}/{readable}-{digest}"


def staging_dir(uri: str) -> Path:
  """The local staging folder of bucket folder `uri`."""
  return staging_root() / mirror_name(uri)
