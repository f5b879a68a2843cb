"""A bucket workdir's metrics, TensorBoard, goodput and profile files reach the bucket while
the run goes: MetricsWriter asks for an upload every train.metrics_sync_seconds (checked at
metrics lines), at each checkpoint and at the end, and a thread of its own uploads.

Why a thread: an upload to GCS or S3 takes tens of milliseconds to seconds, and far longer
when an endpoint is slow or down; the step loop must not wait for it. A request made while
an upload runs is kept (the newest one only) and sent when that upload ends.

Why a snapshot taken by the loop: metrics.jsonl and tensorboardX's event files are appended
to while the thread reads them. The loop flushes them, then notes each file's size (and
reads small files whole, since goodput.json is replaced, not appended to); the thread
uploads exactly those bytes, so the bucket never holds half a line or half an event. A file
whose size and modification time are the ones last uploaded is not sent again (a profile
trace is large and written once).

A failed upload logs one warning and leaves its files marked unsent, so the next request
sends them again; it never stops the run.
"""

from __future__ import annotations

import logging
import os
import threading
from pathlib import Path

from cardjax.storage.errors import storage_errors
from cardjax.storage.reach import filesystem

log = logging.getLogger("cardjax.train")
SMALL = 1 << 20  # files up to this size are read whole when the snapshot is taken
CHUNK = 8 << 20
CLOSE_TIMEOUT_S = 600.0  # the last upload at the end of a run


def snapshot(local: Path, skip: tuple[str, ...] = ()) -> dict[str, tuple]:
  """{relative path: (size, mtime_ns, bytes or None)} of the files under `local`, the
  bytes read for files up to SMALL; top-level folders named in `skip` are left out."""
  files = {}
  for folder, dirs, names in os.walk(local):
    if folder == str(local):
      dirs[:] = [d for d in dirs if d not in skip]
    for name in names:
      path = os.path.join(folder, name)
      try:
        stat = os.stat(path)
        data = Path(path).read_bytes() if stat.st_size <= SMALL else None
      except FileNotFoundError:  # replaced or removed just now: the next snapshot has it
        continue
      rel = os.path.relpath(path, local).replace(os.sep, "/")
      files[rel] = (len(data) if data is not None else stat.st_size, stat.st_mtime_ns, data)
  return files


class BucketSync:
  """Uploads of local folder `local` to bucket folder `remote`, one at a time, in a
  daemon thread."""

  def __init__(self, local: str | os.PathLike, remote: str, skip: tuple[str, ...] = ()):
    self.local, self.remote, self.skip = Path(local), str(remote), skip
    self.sent: dict[str, tuple[int, int]] = {}  # (size, mtime_ns) in the bucket; thread only
    self.cond = threading.Condition()
    self.wanted = None  # the newest snapshot the thread has not taken yet
    self.busy = False
    self.closed = False
    self.thread = None
    self.uploads = self.failures = 0  # finished uploads, failed ones

  def request(self) -> None:
    """Upload what changed since the last upload, in the background; returns at once (the
    snapshot costs a listing of the folder and reading its small files)."""
    files = snapshot(self.local, self.skip)
    with self.cond:
      if self.closed:
        return
      self.wanted = files
      if self.thread is None:
        self.thread = threading.Thread(target=self._run, name="cardjax-metrics-sync",
                                       daemon=True)
        self.thread.start()
      self.cond.notify_all()

  def wait(self, timeout: float | None = None) -> bool:
    """Until no upload is asked for or running; False when `timeout` passed first."""
    with self.cond:
      return self.cond.wait_for(lambda: self.wanted is None and not self.busy, timeout)

  def close(self, timeout: float = CLOSE_TIMEOUT_S) -> None:
    """A last upload of everything that changed, waited for (up to `timeout`)."""
    self.request()
    with self.cond:
      self.closed = True
      self.cond.notify_all()
    if self.thread is not None:
      self.thread.join(timeout)
      if self.thread.is_alive():
        log.warning("the last upload of %s to %s did not finish in %.0f s; the files are in %s",
                    self.local.name, self.remote, timeout, self.local)

  def _run(self) -> None:
    while True:
      with self.cond:
        self.cond.wait_for(lambda: self.wanted is not None or self.closed)
        if self.wanted is None:  # closed, nothing left to send
          return
        files, self.wanted, self.busy = self.wanted, None, True
      try:
        self._upload(files)
        self.uploads += 1
      except Exception as e:  # the next request sends these files again
        self.failures += 1
        log.warning("uploading the run's metrics to %s failed (retried at the next sync): %s",
                    self.remote, str(e).splitlines()[0] if str(e) else type(e).__name__)
      finally:
        with self.cond:
          self.busy = False
          self.cond.notify_all()

  def _upload(self, files: dict[str, tuple]) -> None:
    changed = sorted(rel for rel, (size, mtime, _) in files.items()
                     if self.sent.get(rel) != (size, mtime))
    if not changed:
      return
    fs = filesystem(self.remote)
    with storage_errors(self.remote, "write"):
      for rel in changed:
        size, mtime, data = files[rel]
        target = f"{self.remote}/{rel}"
        if data is not None:
          fs.pipe_file(target, data)
        else:  # append-only and large: the first `size` bytes, streamed
          with open(self.local / rel, "rb") as src, fs.open(target, "wb") as dst:
            left = size
            while left > 0:
              chunk = src.read(min(left, CHUNK))
              if not chunk:
                break
              dst.write(chunk)
              left -= len(chunk)
        self.sent[rel] = (size, mtime)
