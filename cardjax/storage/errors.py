"""A bucket client's failure (gcsfs, s3fs, botocore, google-auth) as one CardjaxError that
names the path and the fix; the clients raise many exception types for the same cause."""

from __future__ import annotations

import contextlib
from collections.abc import Iterator

from cardjax.errors import CardjaxError
from cardjax.storage.paths import is_remote, scheme

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
