"""Orbax checkpoints on s3://: written to a local staging folder, each finished step then
uploaded, with a commit marker object written last.

Why: orbax 0.12 reaches buckets through tensorstore's gcs driver only; an s3:// directory is
normalised to `s3:/...` and refused ("Checkpoint path should be absolute"). Staging keeps
orbax on local disk, where its atomic rename makes every step whole, and makes the bucket
copy just as safe: a step counts as saved only once `STEP/cardjax_committed` exists, and that
object is uploaded after every other file of the step. An upload cut short (SIGKILL, lost
network) leaves a step without the marker, which readers never see and the next upload of
that step replaces. Restoring downloads the newest committed step to the staging folder.

Multi-host jobs: process 0 downloads and uploads, so the hosts must share the staging folder
($CARDJAX_STAGING_DIR on a shared file system); one host, or local.sh's processes, share
local disk anyway.
"""

from __future__ import annotations

import json
import shutil
import uuid
from pathlib import Path

from cardjax.storage import trees
from cardjax.storage.cache import staging_dir
from cardjax.storage.paths import resolve
from cardjax.storage.reach import checked_path

MARKER = "cardjax_committed"


class StagedCheckpoints:
  """The bucket folder `uri` of orbax steps and its local staging copy (`self.local`, the
  folder orbax itself reads and writes)."""

  def __init__(self, uri: str):
    self.uri = resolve(uri)
    self.remote = checked_path(self.uri)
    root = staging_dir(self.uri)
    self.local = root / "orbax"
    self._ids = root / "committed.json"  # step -> marker id of each local step's upload

  def committed(self) -> dict[int, str]:
    """{step: marker id} of the bucket's complete steps."""
    if not self.remote.is_dir():
      return {}
    steps = {}
    for child in self.remote.iterdir():
      if child.name.isdigit() and (child / MARKER).exists():
        steps[int(child.name)] = (child / MARKER).read_text().strip()
    return steps

  def _local_ids(self) -> dict[int, str]:
    if not self._ids.exists():
      return {}
    return {int(k): v for k, v in json.loads(self._ids.read_text()).items()}

  def _write_ids(self, ids: dict[int, str]) -> None:
    self._ids.parent.mkdir(parents=True, exist_ok=True)
    self._ids.write_text(json.dumps({str(k): v for k, v in sorted(ids.items())}))

  def pull(self, step: int | None = None) -> Path:
    """The local folder, holding the bucket's step `step` (default: its newest committed
    one) and nothing the bucket does not hold: a local step another run or an unfinished
    upload left is deleted."""
    committed = self.committed()
    ids = self._local_ids()
    self.local.mkdir(parents=True, exist_ok=True)
    for child in self.local.iterdir():
      keep = (child.name.isdigit() and int(child.name) in committed
              and committed[int(child.name)] == ids.get(int(child.name)))
      if not keep:
        shutil.rmtree(child) if child.is_dir() else child.unlink()
        if child.name.isdigit():
          ids.pop(int(child.name), None)
    if step is None and committed:
      step = max(committed)
    if step is not None and step in committed and not (self.local / str(step)).is_dir():
      folder = f"{self.uri}/{step}"
      files = {k: v for k, v in trees.listing(folder).items() if k != MARKER}
      trees.download(folder, self.local / str(step), files)  # whole or absent, as orbax expects
      ids[step] = committed[step]
    self._write_ids({k: v for k, v in ids.items() if k in committed})
    return self.local

  def push(self, step: int, kept: set[int] | None = None) -> None:
    """Upload finished local step `step`, its marker last; then delete the bucket's steps
    not in `kept` (None: delete none), marker first, so a half-deleted step is never
    read."""
    target = self.remote / str(step)
    if target.exists():  # an earlier, unfinished upload of this step
      self._delete(step)
    trees.upload(self.local / str(step), str(target))
    # The marker is written here, after the upload, rather than sent as trees.upload's `last`
    # file: it never exists in orbax's local step folder.
    marker = uuid.uuid4().hex
    (target / MARKER).write_text(marker)
    ids = self._local_ids()
    ids[step] = marker
    self._write_ids(ids)
    if kept is not None:
      for old in sorted(self.committed()):
        if old not in kept and old != step:
          self._delete(old)

  def _delete(self, step: int) -> None:
    target = self.remote / str(step)
    (target / MARKER).unlink(missing_ok=True)
    target.rmtree(missing_ok=True)
