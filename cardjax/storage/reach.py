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


def _reachable(url: str, variable: str | None) -> None:
  """A TCP connection to `url`'s host and port, or one CardjaxError."""
  parts = urllib.parse.urlsplit(url if "://" in url else f"http://{url}")
  port = parts.port or (443 if parts.scheme == "https" else 80)
  try:
    with socket.create_connection((parts.hostname, port), timeout=CONNECT_TIMEOUT_S):
      pass
  except OSError as e:
    where = f"{variable}={url}" if variable else url
    fix = ("start the emulator there or correct the variable" if variable else
           "check the network (a machine without internet access cannot use buckets)")
    raise CardjaxError(f"cannot reach the storage endpoint {where} ({e}); {fix}") from None


def _check_gcs(bucket: str) -> None:
  emulator = os.environ.get("STORAGE_EMULATOR_HOST")
  if emulator:
    if not os.environ.get("TENSORSTORE_GCS_HTTP_URL"):
      raise CardjaxError("STORAGE_EMULATOR_HOST is set but TENSORSTORE_GCS_HTTP_URL is not: "
                         "orbax (through tensorstore) would write checkpoints to the real "
                         f"GCS; set TENSORSTORE_GCS_HTTP_URL={emulator} too")
    _reachable(emulator, "STORAGE_EMULATOR_HOST")
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
    _reachable("https://storage.googleapis.com", None)
  import gcsfs
  if not gcsfs.GCSFileSystem().exists(bucket):
    raise CardjaxError(f"gs://{bucket}: no such bucket (or these credentials cannot see it); "
                       f"create it (gcloud storage buckets create gs://{bucket}) or fix the "
                       "name")


def _check_s3(bucket: str) -> None:
  import botocore.session

  endpoint = os.environ.get("AWS_ENDPOINT_URL_S3") or os.environ.get("AWS_ENDPOINT_URL")
  variable = "AWS_ENDPOINT_URL_S3" if os.environ.get("AWS_ENDPOINT_URL_S3") else (
      "AWS_ENDPOINT_URL" if endpoint else None)
  if botocore.session.get_session().get_credentials() is None:
    raise CardjaxError(f"s3://{bucket}: no AWS credentials; set AWS_ACCESS_KEY_ID and "
                       "AWS_SECRET_ACCESS_KEY, or AWS_PROFILE (~/.aws/credentials)")
  _reachable(endpoint or "https://s3.amazonaws.com", variable)
  import s3fs
  if not s3fs.S3FileSystem().exists(bucket):
    raise CardjaxError(f"s3://{bucket}: no such bucket (or these credentials cannot see it); "
                       f"create it (aws s3 mb s3://{bucket}) or fix the name")
