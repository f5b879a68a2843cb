"""Corpus files on local disk or in a bucket (gs://, s3://): glob, open, clear errors.

Bucket files are read through fsspec (gcsfs / s3fs) as seekable file objects, so the
format readers stream them as they stream local files (Parquet fetches one column chunk
at a time, compressed JSONL is decompressed as it arrives). Bucket errors become one
CardjaxError naming the path and the fix: the endpoint is probed first with a short TCP
connect (storage.reach.check_endpoint), the clients' failures are mapped by
storage.errors.storage_errors.
"""

from __future__ import annotations

import contextlib
import glob
import os
from collections.abc import Iterator

from cardjax.errors import CardjaxError
from cardjax.storage import is_remote, scheme
from cardjax.storage.errors import storage_errors
from cardjax.storage.reach import filesystem


def _uri(kind: str, found: str) -> str:
  """fsspec lists bucket paths without their scheme."""
  return found if "://" in found else f"{kind}://{found}"


def glob_files(pattern: str) -> list[str]:
  """The files (not folders) that `pattern` matches; `**` recurses, on disk and in buckets."""
  if not is_remote(pattern):
    return [p for p in glob.glob(pattern, recursive=True) if os.path.isfile(p)]
  kind = scheme(pattern)
  fs = filesystem(pattern)
  with storage_errors(pattern, "list"):
    if not glob.has_magic(pattern):  # one object; glob() would also list a folder's name
      return [pattern] if fs.isfile(pattern) else []
    hits = fs.glob(pattern, detail=True)
  return sorted(_uri(kind, name) for name, info in hits.items() if info.get("type") == "file")


@contextlib.contextmanager
def open_binary(path: str) -> Iterator:
  """A binary, seekable file object of a local or bucket file."""
  if not is_remote(path):
    with open(path, "rb") as f:
      yield f
    return
  fs = filesystem(path)
  with storage_errors(path):
    f = fs.open(path, "rb")
  with f:
    yield f


def relative(path: str, root: str) -> str:
  """`path` relative to folder `root` with / separators (both local, or both bucket URIs)."""
  if is_remote(path):
    return path[len(root):].lstrip("/") if path.startswith(root.rstrip("/") + "/") else path
  return os.path.relpath(path, root).replace(os.sep, "/")


def common_root(roots: list[str]) -> str:
  """The deepest folder above all of `roots` (local paths, or URIs of one bucket)."""
  remote = {is_remote(r) for r in roots}
  if len(remote) > 1:
    raise CardjaxError(f"paths mix local files and bucket URIs ({', '.join(roots)}); build "
                       "them as two datasets, or copy one side next to the other")
  if not remote.pop():
    return os.path.commonpath(roots)
  kinds = {r.split("://", 1)[0] for r in roots}
  parts = [r.split("://", 1)[1].split("/") for r in roots]
  common = []
  for level in zip(*parts):
    if len(set(level)) > 1:
      break
    common.append(level[0])
  if len(kinds) > 1 or not common:
    raise CardjaxError(f"paths span several buckets or stores ({', '.join(roots)}); build "
                       "one dataset per bucket")
  return f"{kinds.pop()}://{'/'.join(common)}"
