"""Checks, before any work, that a bucket URI can be used: its endpoint answers, there are
credentials, the bucket exists. Each failure is one CardjaxError naming the fix; without
these checks gcsfs, s3fs and tensorstore retry for minutes and then fail deep in a save.

`check` is all three (the run side, at each path's entry); `check_endpoint` is the endpoint
alone, the one TCP probe both use (the data side and the tree copier, whose clients then
report credentials and missing objects through cardjax/storage/errors.py).
"""

from __future__ import annotations

import functools
import os
import socket
import urllib.parse

from etils import epath

from cardjax.errors import CardjaxError
from cardjax.storage.paths import resolve, scheme

CONNECT_TIMEOUT_S = 5.0


def check(path: str | os.PathLike) -> None:
  """Nothing for a local path; for gs:// and s3:// the checks above (once per bucket and
  environment in a process)."""
  text = resolve(path)
  name = scheme(text)
  if name is None:
    return
  bucket = text.split("://", 1)[1].split("/", 1)[0]
  if name == "gs":
    keys = ("STORAGE_EMULATOR_HOST", "TENSORSTORE_GCS_HTTP_URL")
  else:
    keys = ("AWS_ENDPOINT_URL_S3", "AWS_ENDPOINT_URL", "AWS_ACCESS_KEY_ID", "AWS_PROFILE")
  _check(name, bucket, tuple(os.environ.get(k) for k in keys))


def checked_path(path: str | os.PathLike) -> epath.Path:
  """paths.as_path, for a path about to be read or written: a bucket is checked first
  (`check`), so a wrong endpoint, missing credentials or a missing bucket is one clear
  error, not minutes of retries."""
  text = resolve(path)
  check(text)
  return epath.Path(text)


@functools.lru_cache(maxsize=None)
def _check(name: str, bucket: str, env: tuple) -> None:
  (_check_gcs if name == "gs" else _check_s3)(bucket)


def endpoint(kind: str) -> tuple[str, str | None]:
  """(URL, the variable that set it, or None) of the gs:// or s3:// service the clients
  talk to: an emulator's when one is set."""
  names = ("STORAGE_EMULATOR_HOST",) if kind == "gs" else ("AWS_ENDPOINT_URL_S3",
                                                          "AWS_ENDPOINT_URL")
  for name in names:
    if os.environ.get(name):
      return os.environ[name], name
  return ("https://storage.googleapis.com" if kind == "gs" else "https://s3.amazonaws.com",
          None)


def probe(url: str) -> OSError | None:
  """None when a TCP connection to `url`'s host and port opens, else the error it raised."""
  parts = urllib.parse.urlsplit(url if "://" in url else f"http://{url}")
  port = parts.port or (443 if parts.scheme == "https" else 80)
  try:
    with socket.create_connection((parts.hostname, port), timeout=CONNECT_TIMEOUT_S):
      return None
  except OSError as e:
    return e


# A success is remembered for the process; a failure is probed again on the next call (the
# network back, the emulator started).
_probe_once = functools.lru_cache(maxsize=None)(probe)


def check_endpoint(path: str) -> None:
  """Raise at once (within CONNECT_TIMEOUT_S) when the endpoint of bucket path `path` does not
  answer: gcsfs retries a refused connection for about 30 s, tensorstore for minutes."""
  kind = scheme(path)
  url, variable = endpoint(kind)
  if (error := _probe_once(url)) is None:
    return
  _probe_once.cache_clear()
  fix = (f"start the emulator there or correct {variable}" if variable else
         "check the network (a machine without internet access cannot use buckets)")
  raise CardjaxError(f"{path}: cannot reach the {kind}:// endpoint {url} "
                     f"({type(error).__name__}: {error}); {fix}")


def filesystem(path: str):
  """The fsspec file system (gcsfs, s3fs) of bucket path `path`, its endpoint checked first."""
  import fsspec

  check_endpoint(path)
  return fsspec.filesystem(scheme(path))


def _check_gcs(bucket: str) -> None:
  url, variable = endpoint("gs")
  if variable:
    if not os.environ.get("TENSORSTORE_GCS_HTTP_URL"):
      raise CardjaxError("STORAGE_EMULATOR_HOST is set but TENSORSTORE_GCS_HTTP_URL is not: "
                         "orbax (through tensorstore) would write checkpoints to the real "
                         f"GCS; set TENSORSTORE_GCS_HTTP_URL={url} too")
    check_endpoint(f"gs://{bucket}")
  else:
    import google.auth
    from google.auth.exceptions import DefaultCredentialsError

    try:
      google.auth.default()
    except DefaultCredentialsError:
      raise CardjaxError(f"gs://{bucket}: no Google Cloud credentials; run `gcloud auth "
                         "application-default login`, or set GOOGLE_APPLICATION_CREDENTIALS "
                         "to a service-account key file (on a GCP VM the VM's service "
                         "account is used)") from None
    check_endpoint(f"gs://{bucket}")
  import gcsfs
  if not gcsfs.GCSFileSystem().exists(bucket):
    raise CardjaxError(f"gs://{bucket}: no such bucket (or these credentials cannot see it); "
                       f"create it (gcloud storage buckets create gs://{bucket}) or fix the "
                       "name")


def _check_s3(bucket: str) -> None:
  import botocore.session

  if botocore.session.get_session().get_credentials() is None:
    raise CardjaxError(f"s3://{bucket}: no AWS credentials; set AWS_ACCESS_KEY_ID and "
                       "AWS_SECRET_ACCESS_KEY, or AWS_PROFILE (~/.aws/credentials)")
  check_endpoint(f"s3://{bucket}")
  import s3fs
  if not s3fs.S3FileSystem().exists(bucket):
    raise CardjaxError(f"s3://{bucket}: no such bucket (or these credentials cannot see it); "
                       f"create it (aws s3 mb s3://{bucket}) or fix the name")
