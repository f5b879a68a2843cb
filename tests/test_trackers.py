"""train.trackers: a run logged to Weights & Biases in offline mode (its history read back
from the run file W&B writes, against metrics.jsonl), resumed under the same W&B run;
unknown trackers and a missing wandb package are one clear error each, before any work."""

import importlib.util
import json
import struct

import pytest

from cardjax.config import load_config
from cardjax.errors import CardjaxError, ConfigError
from cardjax.train import loop, train
from train_helpers import prepare_small, small_config

wandb_pb = pytest.importorskip("wandb.proto.wandb_internal_pb2")


def _records(path):
  """The records of a W&B run file (run-ID.wandb): a 7-byte header (":W&B", a magic
  number, a version), then LevelDB's log format (32 KiB blocks of chunks, each with a CRC,
  a length and a type: full, first, middle or last) around Record protobufs."""
  data = path.read_bytes()
  assert data[:4] == b":W&B"
  pos, pending, block = 7, b"", 32768
  while pos + 7 <= len(data):
    left = block - pos % block
    if left < 7:  # a block's tail too short for a header is padding
      pos += left
      continue
    _, length, kind = struct.unpack("<IHB", data[pos:pos + 7])
    if kind == 0:
      pos += left
      continue
    pending += data[pos + 7:pos + 7 + length]
    pos += 7 + length
    if kind in (1, 4):  # full, last
      record = wandb_pb.Record()
      record.ParseFromString(pending)
      pending = b""
      yield record


def _history(run_dir):
  """(run id, {step: {key: value}}) of an offline run folder."""
  (path,) = run_dir.glob("run-*.wandb")
  run_id, rows = None, {}
  for record in _records(path):
    kind = record.WhichOneof("record_type")
    if kind == "run":
      run_id = record.run.run_id
    elif kind == "history":
      rows[record.history.step.num] = {
          item.key or "/".join(item.nested_key): json.loads(item.value_json)
          for item in record.history.item if not (item.key or "").startswith("_")}
  return run_id, rows


@pytest.fixture(scope="module")
def data_dir(tmp_path_factory):
  return prepare_small(tmp_path_factory.mktemp("data"))


def test_a_run_logs_to_wandb_offline_and_resumes_the_same_wandb_run(data_dir, tmp_path,
                                                                    monkeypatch):
  monkeypatch.setenv("WANDB_MODE", "offline")
  monkeypatch.setenv("WANDB_DIR", str(tmp_path / "wandb"))
  monkeypatch.setenv("WANDB_SILENT", "true")
  run = tmp_path / "run"
  config = ["--config.train.trackers=wandb", "--config.train.wandb_project=cardjax-test",
            "--config.train.log_every=2", "--config.train.checkpoint_every=4"]
  train(small_config(data_dir, *config, "--config.train.steps=4"), run)
  run_id = json.loads((run / "wandb.json").read_text())["id"]
  (first,) = (tmp_path / "wandb" / "wandb").glob("offline-run-*")
  got_id, rows = _history(first)
  assert got_id == run_id and first.name.endswith(f"-{run_id}")
  lines = [json.loads(l) for l in open(run / "metrics.jsonl")]
  train_lines = {l["step"]: l for l in lines if "train/loss" in l}
  assert sorted(rows) == [2, 4] == sorted(train_lines)
  for step, line in train_lines.items():
    assert rows[step]["train/loss"] == line["train/loss"]  # the same float, to the last bit
    assert rows[step]["train/step_s"] == line["train/step_s"]
    assert rows[step]["train/goodput"] == line["train/goodput"]
  final_eval = next(l for l in lines if "eval/loss" in l)
  assert rows[4]["eval/loss"] == final_eval["eval/loss"]

  # Resumed (a second attempt): the same W&B run id, steps 6 and 8.
  train(small_config(data_dir, *config, "--config.train.steps=8"), run)
  second = [p for p in (tmp_path / "wandb" / "wandb").glob("offline-run-*") if p != first]
  assert len(second) == 1
  got_id, rows = _history(second[0])
  assert got_id == run_id and sorted(rows) == [6, 8]
  lines = {json.loads(l)["step"]: json.loads(l) for l in open(run / "metrics.jsonl")
           if "train/loss" in l}
  assert rows[8]["train/loss"] == lines[8]["train/loss"]


def test_an_unknown_tracker_is_one_error_naming_the_known_ones():
  with pytest.raises(ConfigError) as e:
    load_config("configs/tiny_ar.py", ["--config.train.trackers=wandb, mlflow"])
  assert "train.trackers='wandb, mlflow'" in str(e.value)
  assert "unknown tracker 'mlflow'; known: wandb" in str(e.value)


def test_a_missing_wandb_package_is_one_error_before_any_work(data_dir, tmp_path,
                                                              monkeypatch):
  real = importlib.util.find_spec
  monkeypatch.setattr(importlib.util, "find_spec",
                      lambda name, *a: None if name == "wandb" else real(name, *a))

  def no_setup(*_):
    raise AssertionError("the run was set up (a compile, the data) before the error")

  monkeypatch.setattr(loop, "setup", no_setup)
  with pytest.raises(CardjaxError) as e:
    train(small_config(data_dir, "--config.train.trackers=wandb"), tmp_path / "run")
  assert "pip install 'cardjax[wandb]'" in str(e.value)
  assert not (tmp_path / "run").exists()
