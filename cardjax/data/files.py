"""Corpus files on local disk or in a bucket (gs://, s3://): glob, open, clear errors.

Bucket files are read through fsspec (gcsfs / s3fs) as seekable file objects, so the
format readers stream them as they stream local files (Parquet fetches one column chunk
at a time, compressed JSONL is decompressed as it arrives). Bucket errors become one
CardjaxError naming the path and the fix: gcsfs retries a refused connection for about
30 s, so an endpoint is probed once with a short TCP connect first (storage.reach's probe).
"""

from __future__ import annotations

import contextlib
import functools
import glob
import os
from collections.abc import Iterator

from cardjax.errors import CardjaxError
from cardjax.storage import is_remote, scheme
from cardjax.storage.reach import endpoint, probe

# A success is remembered for the process; a failure is probed again on the next call.
_probe = functools.lru_cache(maxsize=None)(probe)


def check_reachable(path: str) -> None:
  """Raise at once when the storage endpoint of bucket path `path` does not answer."""
  kind = scheme(path)
  url, _ = endpoint(kind)
  if (error := _probe(url)) is not None:
    _probe.cache_clear()  # a later call (the network back) probes again
    raise CardjaxError(
        f"{path}: cannot reach the {kind}:// endpoint {url} ({type(error).__name__}: "
        f"{error}); check the network, or the endpoint variable (STORAGE_EMULATOR_HOST for "
        "gs://, AWS_ENDPOINT_URL for s3://)")


def filesystem(path: str):
  """The fsspec file system of bucket path `path`, its endpoint checked first."""
  import fsspec

  check_reachable(path)
  return fsspec.filesystem(scheme(path))


_CREDENTIALS = {
    "gs": "run `gcloud auth application-default login` or set GOOGLE_APPLICATION_CREDENTIALS",
    "s3": "set AWS_ACCESS_KEY_ID and AWS_SECRET_ACCESS_KEY (or AWS_PROFILE)",
}


# Words of the clients' errors for a refused or unsigned request (S3 error codes, botocore's
# and google-auth's exception names).
_DENIED = ("Credentials", "credentials", "AccessDenied", "Access Denied", "Forbidden",
           "Unauthorized", "InvalidAccessKeyId", "SignatureDoesNotMatch")


@contextlib.contextmanager
def storage_errors(path: str, action: str = "read") -> Iterator[None]:
  """Turn a bucket client's failure on `path` into one CardjaxError with the fix."""
  if not is_remote(path):
    yield
    return
  kind = scheme(path)
  try:
    yield
  except CardjaxError:
    raise
  except Exception as e:  # the clients raise many types; name what it means where we can
    text = f"{type(e).__name__}: {e}"
    code = getattr(e, "code", None)  # gcsfs' HttpError carries the HTTP status
    if (isinstance(e, PermissionError) or code in (401, 403)
        or any(w in text for w in _DENIED)):
      raise CardjaxError(
          f"{path}: cannot {action} it, access denied or no credentials ({text[:300]}); "
          f"{_CREDENTIALS[kind]}, with access to the bucket") from None
    if isinstance(e, FileNotFoundError) or code == 404 or "NoSuchBucket" in text:
      raise CardjaxError(f"{path}: not found ({text[:300]}); check the bucket and the "
                         "path") from None
    raise CardjaxError(f"{path}: cannot {action} it ({text[:300]})") from e


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
