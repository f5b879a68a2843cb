"""How cardjax sets up fsspec's bucket file systems (gcsfs, s3fs), once, at import.

- No listings cache: gcsfs and s3fs remember a folder's listing for the life of the
  process, so a trainer, a server or a test would never see steps another process (a host
  of the same job, a run being watched) saved after the first listing. A listing is one
  request; checkpoint steps are few.
- gcsfs's per-call "Could not determine bucket type ... falling back to GCSFileSystem"
  warning is dropped: gcsfs asks a control-plane API (absent from emulators, and not granted
  to every credential) for the bucket's layout and falls back to the plain file system,
  which is what cardjax uses anyway. Other gcsfs warnings still show.
"""

from __future__ import annotations

import logging

import fsspec

_NOISE = ("Could not determine bucket type", "storage layout api")


class _DropBucketType(logging.Filter):
  def filter(self, record: logging.LogRecord) -> bool:
    message = record.getMessage()
    return not any(n in message for n in _NOISE)


def install() -> None:
  for protocol in ("gs", "gcs", "s3", "s3a"):
    fsspec.config.conf.setdefault(protocol, {}).setdefault("use_listings_cache", False)
  logger = logging.getLogger("gcsfs")
  if not any(isinstance(f, _DropBucketType) for f in logger.filters):
    logger.addFilter(_DropBucketType())
