"""Checks, before any work, that a bucket URI can be used: its endpoint answers, there are
credentials, the bucket exists. Each failure is one CardjaxError naming the fix; without
these checks gcsfs, s3fs and tensorstore retry for minutes and then fail deep in a save.
"""

from __future__ import annotations

import functools
import os
import socket
import urllib.parse

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


def _reachable(url: str, variable: str | None) -> None:
  """A TCP connection to `url`'s host and port, or one CardjaxError."""
  if (reason := probe(url)) is not None:
    where = f"{variable}={url}" if variable else url
    fix = ("start the emulator there or correct the variable" if variable else
           "check the network (a machine without internet access cannot use buckets)")
    raise CardjaxError(f"cannot reach the storage endpoint {where} ({reason}); {fix}")


def _check_gcs(bucket: str) -> None:
  url, variable = endpoint("gs")
  if variable:
    if not os.environ.get("TENSORSTORE_GCS_HTTP_URL"):
      raise CardjaxError("STORAGE_EMULATOR_HOST is set but TENSORSTORE_GCS_HTTP_URL is not: "
                         "orbax (through tensorstore) would write checkpoints to the real "
                         f"GCS; set TENSORSTORE_GCS_HTTP_URL={url} too")
    _reachable(url, variable)
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
    _reachable(url, None)
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
  _reachable(*endpoint("s3"))
  import s3fs
  if not s3fs.S3FileSystem().exists(bucket):
    raise CardjaxError(f"s3://{bucket}: no such bucket (or these credentials cannot see it); "
                       f"create it (aws s3 mb s3://{bucket}) or fix the name")
