"""Local-or-bucket path handling: `resolve` (the one normalisation) and `as_path`. Pure:
nothing here reaches a bucket (reach.py checks one, and its `checked_path` is `as_path`
after that check)."""

from __future__ import annotations

import os

from etils import epath

from cardjax.errors import ConfigError

# Schemes with a file system behind them (fsspec's gcsfs / s3fs through etils.epath).
REMOTE_SCHEMES = ("gs", "s3")


def scheme(path: str | os.PathLike) -> str | None:
  """"gs" or "s3" for a bucket URI, None for a local path; another scheme is an error."""
  text = os.fspath(path)
  if "://" not in text:
    return None
  name = text.split("://", 1)[0].lower()
  if name not in REMOTE_SCHEMES:
    raise ConfigError(f"{text}: unsupported storage scheme {name}://; use a local path, "
                      f"gs://BUCKET/... or s3://BUCKET/...")
  return name


def is_remote(path: str | os.PathLike) -> bool:
  return scheme(str(path)) is not None


def resolve(path: str | os.PathLike) -> str:
  """A bucket URI unchanged (less a trailing slash); a local path made absolute, `~`
  expanded. Call it once, where a user's path enters."""
  text = os.fspath(path)
  if scheme(text) is not None:
    name, rest = text.split("://", 1)
    rest = rest.rstrip("/")
    if not rest or rest.startswith("/"):
      raise ConfigError(f"{text}: a bucket URI is {name}://BUCKET/PATH")
    return f"{name.lower()}://{rest}"
  return os.path.abspath(os.path.expanduser(text))


def as_path(path: str | os.PathLike) -> epath.Path:
  """An epath.Path of `resolve(path)`: pathlib's API over local disk, gs:// and s3://. Pure:
  nothing is reached (see reach.checked_path)."""
  return epath.Path(resolve(path))
