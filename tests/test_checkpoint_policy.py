"""Which training checkpoints are kept (the newest; the newest `keep` regular saves; every
milestone for good; other saves until a newer step exists), the same in an s3:// bucket,
and an s3:// save that returns once the step is whole in its staging folder while the
upload goes on in the background."""

import time

import jax.numpy as jnp
import ml_collections
import numpy as np
import pytest
from cloud_emulators import emulated
from test_data_pipeline import TEXT_SOURCE, tok  # noqa: F401

from cardjax.data.pipeline import DataLoader, PipelineSpec
from cardjax.model import ModelConfig
from cardjax.storage import as_path
from cardjax.train.checkpointing import TrainCheckpointer

CFG = ModelConfig(vocab_size=64, hidden_size=8, intermediate_size=16, num_layers=1)


def _save(ckpt, step, loader, size=4):
  params = {"w": jnp.full((size,), float(step))}
  ckpt.save(step, params, {"m": params["w"] * 0}, loader, ml_collections.ConfigDict(), CFG)
  ckpt.wait()


@pytest.fixture
def loader(tok):  # noqa: F811
  with DataLoader(TEXT_SOURCE, tok, PipelineSpec(seq_len=32, batch_size=2)) as data:
    yield data


def test_retention_keeps_newest_regular_and_milestones(tmp_path, loader):
  ckpt = TrainCheckpointer(tmp_path / "ck", keep=2, async_save=True, every=2, keep_every=6)
  history = {}
  for step in (2, 4, 5, 6, 8, 10, 11, 12, 13):  # 5, 11 and 13: time-based or a stop
    _save(ckpt, step, loader)
    history[step] = ckpt.steps()
  assert history[5] == [2, 4, 5]       # the newest (a time-based save) and 2 regular
  assert history[6] == [4, 6]          # 5 was kept only while it was the newest
  assert history[11] == [6, 8, 10, 11]  # 6: a milestone
  assert history[13] == [6, 10, 12, 13]  # 12: regular and a milestone
  ckpt.close()


@pytest.mark.parametrize("every,keep", [(0, 3), (3, 0)])
def test_retention_without_regular_saves_or_limit(tmp_path, loader, every, keep):
  ckpt = TrainCheckpointer(tmp_path / "ck", keep=keep, async_save=False, every=every)
  for step in range(1, 8):
    _save(ckpt, step, loader)
  assert ckpt.steps() == ([7] if every == 0 else [3, 6, 7])
  ckpt.close()


def test_s3_saves_return_before_the_upload_and_the_bucket_keeps_what_is_kept(
    tmp_path, loader, monkeypatch):
  monkeypatch.setenv("CARDJAX_STAGING_DIR", str(tmp_path / "staging"))
  size = 8 << 20  # 32 MiB of float32 per item: an upload long enough to measure
  with emulated("s3") as (_, root):
    ckpt = TrainCheckpointer(f"{root}/run/checkpoints", keep=1, async_save=True, every=1)
    blocked, uploads = [], []
    for step in (1, 2, 3):
      params = {"w": jnp.full((size,), float(step))}
      start = time.perf_counter()
      ckpt.save(step, params, {"m": params["w"] * 0}, loader, ml_collections.ConfigDict(),
                CFG)
      blocked.append(time.perf_counter() - start)
      assert ckpt.upload is not None and ckpt.upload.is_alive()  # still uploading
      start = time.perf_counter()
      ckpt.wait_upload()
      uploads.append(time.perf_counter() - start)
      assert sorted(ckpt.staged.committed()) == [step]  # the newest only, as locally
    ckpt.close()
    bucket = as_path(f"{root}/run/checkpoints")
    assert sorted(p.name for p in bucket.iterdir() if p.name.isdigit()) == ["3"]
  print(f"s3 save: the step blocked {np.median(blocked):.2f} s; the upload went on "
        f"{np.median(uploads):.2f} s more (median of 3, 64 MiB a step)")
  assert np.median(uploads) > 0


def test_timed_saves_turn_minutes_into_agreed_steps(monkeypatch):
  from cardjax.train import timed_save

  clock = [0.0]
  monkeypatch.setattr(timed_save.time, "monotonic", lambda: clock[0])

  class Times:
    def adding(self, name):
      import contextlib
      return contextlib.nullcontext()

  class Job:
    last_saved = None
    saved: list = []
    times = Times()

    def save(self, step):
      self.saved.append(step)
      self.last_saved = step

  class Finite:
    def now(self):
      pass

  job, action = Job(), timed_save.TimedSave(minutes=0.1, start=100, finite=Finite())
  for step in range(101, 140):
    clock[0] += 60.0 if step == 101 else 1.0  # a long first step (it compiles), then 1 s
    if action.due(step):
      action.run(job, step)
  # Agreed at step 111 (10 steps of 1 s after the first): a save every 6 steps (6 s).
  assert job.saved == [117, 123, 129, 135]
  assert not timed_save.TimedSave(0, 0, Finite()).due(5)
