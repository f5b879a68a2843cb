"""A bucket workdir's metrics reach the bucket while the run goes: the background uploads
(what is sent, that a request never waits for an upload, that a failure is one warning and
is retried), and a training on the GCS emulator whose bucket holds its metrics lines, its
TensorBoard and goodput files before its first checkpoint, and whose PROFILE object asks
for a profile."""

import json
import threading
import time

import fsspec
import pytest

from cardjax import checkpoint
from cardjax.storage import as_path, trees
from cardjax.train import loop, metrics_sync, profile_demand, train
from cardjax.train.metrics_sync import BucketSync
from cloud_emulators import emulated
from trace_helpers import traced_steps
from train_helpers import prepare_small, small_config


class _Bucket:
  """fsspec's in-memory file system standing in for bucket gs://b; `gate` (when set) holds
  every write until it is opened, `fail` makes the next n writes fail."""

  def __init__(self):
    self.fs = fsspec.filesystem("memory")
    self.fs.store.clear()
    self.gate = None
    self.fail = 0
    self.writes = []

  def _enter(self, path):
    if self.gate is not None:
      assert self.gate.wait(30)
    if self.fail:
      self.fail -= 1
      raise OSError(f"503 Service Unavailable: {path}")
    self.writes.append(path)

  def pipe_file(self, path, data):
    self._enter(path)
    self.fs.pipe_file(_memory(path), data)

  def open(self, path, mode):
    self._enter(path)
    return self.fs.open(_memory(path), mode)

  def cat(self, path):
    return self.fs.cat(_memory(path))

  def exists(self, path):
    return self.fs.exists(_memory(path))


def _memory(path):
  return path.replace("gs://", "memory://", 1)


@pytest.fixture
def bucket(monkeypatch):
  fake = _Bucket()
  monkeypatch.setattr(metrics_sync, "filesystem", lambda _: fake)
  return fake


def test_uploads_what_was_written_at_the_request_and_skips_unchanged_files(tmp_path, bucket,
                                                                           monkeypatch):
  monkeypatch.setattr(metrics_sync, "SMALL", 16)  # events.bin is "large": streamed by size
  (tmp_path / "tensorboard").mkdir()
  (tmp_path / "wandb").mkdir()
  jsonl, events = tmp_path / "metrics.jsonl", tmp_path / "tensorboard" / "events.bin"
  jsonl.write_text('{"step": 2}\n')
  events.write_bytes(b"0123456789" * 3)
  (tmp_path / "wandb" / "run.wandb").write_text("W&B's own")
  sync = BucketSync(tmp_path, "gs://b/run", skip=("wandb",))
  bucket.gate = threading.Event()
  sync.request()
  # Written after the request: not in this upload (the bucket never gets half a line).
  with open(jsonl, "a") as f:
    f.write('{"step": 4')
  with open(events, "ab") as f:
    f.write(b"more")
  bucket.gate.set()
  assert sync.wait(30)
  assert bucket.cat("gs://b/run/metrics.jsonl") == b'{"step": 2}\n'
  assert bucket.cat("gs://b/run/tensorboard/events.bin") == b"0123456789" * 3
  assert not bucket.exists("gs://b/run/wandb/run.wandb")
  # Only what changed goes again.
  with open(jsonl, "a") as f:
    f.write("}\n")
  bucket.writes.clear()
  sync.request()
  assert sync.wait(30)
  assert sorted(bucket.writes) == ["gs://b/run/metrics.jsonl",
                                   "gs://b/run/tensorboard/events.bin"]
  bucket.writes.clear()
  sync.request()
  assert sync.wait(30) and bucket.writes == []
  sync.close()
  assert bucket.cat("gs://b/run/metrics.jsonl") == b'{"step": 2}\n{"step": 4}\n'


def test_a_request_never_waits_for_a_running_upload(tmp_path, bucket):
  (tmp_path / "metrics.jsonl").write_text("1\n")
  sync = BucketSync(tmp_path, "gs://b/run")
  bucket.gate = threading.Event()
  took = []
  for line in ("2\n", "3\n", "4\n"):  # the first upload hangs; the next ones wait, merged
    start = time.perf_counter()
    sync.request()
    took.append(time.perf_counter() - start)
    with open(tmp_path / "metrics.jsonl", "a") as f:
      f.write(line)
  assert max(took) < 0.1, took
  assert not sync.wait(0.2)  # still uploading
  bucket.gate.set()
  assert sync.wait(30)
  # The hung upload, then one for the requests made meanwhile: the newest one's bytes.
  assert sync.uploads <= 2
  assert bucket.cat("gs://b/run/metrics.jsonl") == b"1\n2\n3\n"
  sync.close()
  assert bucket.cat("gs://b/run/metrics.jsonl") == b"1\n2\n3\n4\n"


def test_a_failed_upload_is_one_warning_and_is_sent_at_the_next_request(tmp_path, bucket,
                                                                       caplog):
  (tmp_path / "metrics.jsonl").write_text("1\n")
  sync = BucketSync(tmp_path, "gs://b/run")
  bucket.fail = 1
  sync.request()
  assert sync.wait(30)
  warnings = [r for r in caplog.records if r.levelname == "WARNING"]
  assert len(warnings) == 1 and "retried at the next sync" in warnings[0].getMessage()
  assert "503 Service Unavailable" in warnings[0].getMessage()
  assert not bucket.exists("gs://b/run/metrics.jsonl")
  sync.request()  # nothing changed locally, but the file was never sent
  assert sync.wait(30)
  assert bucket.cat("gs://b/run/metrics.jsonl") == b"1\n"
  assert sync.failures == 1 and len(caplog.records) == 1
  sync.close()


@pytest.fixture(scope="module")
def data_dir(tmp_path_factory):
  return prepare_small(tmp_path_factory.mktemp("data"))


def test_a_bucket_run_uploads_its_metrics_before_its_first_checkpoint(data_dir, tmp_path,
                                                                      monkeypatch):
  """10 steps, a line every 2, no checkpoint before the final one, metrics_sync_seconds=0.
  Before step 7 runs, the bucket already holds the lines of steps 2, 4 and 6, TensorBoard
  events and goodput.json, and no checkpoint. A PROFILE object in the bucket (looked for
  every 0.2 s here instead of 30 s) profiles steps 5 and 6 and is removed."""
  monkeypatch.setenv("CARDJAX_STAGING_DIR", str(tmp_path / "staging"))
  monkeypatch.setattr(profile_demand, "POLL_BUCKET_S", 0.2)
  seen = {}
  real_advance = loop.Job.advance

  def advance(job, step):
    if step == 3:  # asked for before the line of step 4
      as_path(f"{run}/PROFILE").write_text("")
      deadline = time.monotonic() + 30
      while not job_requests() and time.monotonic() < deadline:
        time.sleep(0.05)
    if step == 7:  # the line of step 6 was written after step 6: wait for its upload
      deadline = time.monotonic() + 30
      while time.monotonic() < deadline:
        lines = _bucket_lines(run)
        if lines and lines[-1]["step"] == 6:
          break
        time.sleep(0.05)
      seen["lines"] = [l["step"] for l in _bucket_lines(run)]
      seen["checkpoints"] = checkpoint.saved_steps(f"{run}/checkpoints")
      seen["events"] = [p.name for p in (as_path(run) / "tensorboard").iterdir()]
      seen["goodput"] = json.loads((as_path(run) / "goodput.json").read_text())
    real_advance(job, step)

  requests = []
  real_requests = profile_demand.Requests

  def make_requests(*args, **kwargs):
    requests.append(real_requests(*args, **kwargs))
    return requests[-1]

  def job_requests():
    return requests and requests[0].asked()

  monkeypatch.setattr(loop.Job, "advance", advance)
  monkeypatch.setattr(profile_demand, "Requests", make_requests)
  with emulated("gs") as (_, root):
    run = f"{root}/run"
    train(small_config(data_dir, "--config.train.steps=10", "--config.train.log_every=2",
                       "--config.train.checkpoint_every=100", "--config.train.eval_every=0",
                       "--config.train.metrics_sync_seconds=0",
                       "--config.train.profile_on_demand_steps=2"), run)
    assert seen["lines"] == [2, 4, 6] and seen["checkpoints"] == []
    assert any(name.startswith("events.out.tfevents") for name in seen["events"])
    # As of the line of step 6 (step 6's own time is counted once its actions end).
    assert seen["goodput"]["attempts"][0]["last_step"] == 5
    # At the end: every line, the profile of steps 5:6 (uploaded by the final sync), the
    # request object gone.
    assert [l["step"] for l in _bucket_lines(run)] == [2, 4, 6, 8, 10]
    traces = [rel for rel in trees.listing(f"{run}/profile/steps_5-6")
              if rel.endswith(".xplane.pb")]
    assert len(traces) == 1, traces
    data = (as_path(run) / "profile" / "steps_5-6" / traces[0]).read_bytes()
    assert traced_steps(data) == [5, 6]
    assert not (as_path(run) / "PROFILE").exists()


def _bucket_lines(run):
  try:
    text = (as_path(run) / "metrics.jsonl").read_text()
  except OSError:  # not there yet, or replaced by an upload while read: the caller waits
    return []
  return [json.loads(l) for l in text.splitlines() if "train/loss" in l]
