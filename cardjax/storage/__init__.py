"""Paths that are local folders or bucket URIs (gs://, s3://), one rule for the whole project.

Local paths are made absolute once, where they enter (the CLI, a public function); bucket
URIs are kept as they are and read and written through `etils.epath` (gcsfs / s3fs), the
layer orbax and tfds use too. `pathlib.Path("gs://b/run")` would silently become a local
folder named `gs:`, so no module should build a Path from a user's string: call `resolve`.
"""

from cardjax.storage import fsspec_setup
from cardjax.storage.paths import as_path, is_remote, resolve, scheme
from cardjax.storage.reach import check, checked_path

fsspec_setup.install()

__all__ = ["as_path", "check", "checked_path", "is_remote", "resolve", "scheme"]
