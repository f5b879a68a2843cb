"""Data shards: the global batch is the same whichever host count reads it, and a run
saved on N hosts resumes on M (2 -> 1, 1 -> 2, 4 -> 2) reading every row of the epoch
exactly once; the state files go through orbax's data item; bad counts are one clear
error."""

import json

import numpy as np
import pytest
from test_data_pipeline import DOCS, TEXT_SOURCE, _segments, tok  # noqa: F401

from cardjax.data import shards
from cardjax.data.pipeline import DataLoader, PipelineSpec
from cardjax.errors import CardjaxError


def _hosts(tok, spec, count):  # noqa: F811
  return [DataLoader(TEXT_SOURCE, tok, spec, process_index=i, process_count=count)
          for i in range(count)]


def _global(loaders):
  parts = [next(loader) for loader in loaders]
  return {k: np.concatenate([p[k] for p in parts]) for k in parts[0]}


@pytest.mark.parametrize("count", [2, 4])
def test_the_global_batch_does_not_depend_on_the_host_count(tok, count):  # noqa: F811
  spec = PipelineSpec(seq_len=32, batch_size=8, seed=3, shards=4)
  one, many = _hosts(tok, spec, 1), _hosts(tok, spec, count)
  for _ in range(5):
    want, got = _global(one), _global(many)
    for key in want:
      np.testing.assert_array_equal(got[key], want[key])


@pytest.mark.parametrize("before,after,shard_count", [(2, 1, 2), (1, 2, 2), (4, 2, 4),
                                                      (1, 4, 4)])
def test_a_resume_on_another_host_count_reads_every_row_once(tok, before, after,  # noqa: F811
                                                             shard_count):
  spec = PipelineSpec(seq_len=64, batch_size=4, seed=7, shards=shard_count, num_epochs=1)
  first = _hosts(tok, spec, before)
  seen = []
  for _ in range(3):  # a few steps on the first host count
    for loader in first:
      seen += _segments(tok, [next(loader)])
  states = {}
  for loader in first:  # what the checkpoint keeps: one JSON state per shard
    states.update({s: json.loads(json.dumps(st)) for s, st in loader.shard_states().items()})
  assert sorted(states) == list(range(shard_count))
  for i, loader in enumerate(_hosts(tok, spec, after)):
    loader.set_shard_states({s: states[s] for s in loader.owned})
    seen += _segments(tok, list(loader))  # to the end of the epoch
  assert sorted(seen) == sorted(DOCS)  # no row twice, none skipped


def test_state_files_through_orbax_resume_on_fewer_hosts(tok, tmp_path):  # noqa: F811
  import orbax.checkpoint as ocp

  spec = PipelineSpec(seq_len=32, batch_size=4, seed=1, shards=2)
  reference = _hosts(tok, spec, 1)[0]
  expected = [next(reference) for _ in range(5)]
  hosts = _hosts(tok, spec, 2)
  for _ in range(3):
    _global(hosts)
  folder = tmp_path / "data"
  folder.mkdir()
  handler = shards.ShardStateHandler()
  for loader in hosts:  # each process writes its own shards' files into the item folder
    handler.save(folder, args=shards.ShardStateSave(loader))
  assert sorted(p.name for p in folder.iterdir()) == ["shard_0-of-2.json", "shard_1-of-2.json"]
  assert shards.saved_count([p.name for p in folder.iterdir()]) == 2
  resumed = _hosts(tok, spec, 1)[0]
  handler.restore(folder, args=shards.ShardStateRestore(resumed))
  for want in expected[3:]:
    got = next(resumed)
    for key in want:
      np.testing.assert_array_equal(got[key], want[key])
  assert isinstance(ocp.args.Composite(data=resumed.checkpoint_save()), ocp.args.Composite)


def test_a_single_process_state_from_before_shards_restores(tok, tmp_path):  # noqa: F811
  spec = PipelineSpec(seq_len=32, batch_size=2, seed=4)
  reference = DataLoader(TEXT_SOURCE, tok, spec)
  expected = [next(reference) for _ in range(4)]
  old = DataLoader(TEXT_SOURCE, tok, spec)
  for _ in range(2):
    next(old)
  # The grain state of the one pipeline, as grain's own handler wrote it.
  (tmp_path / "process_0-of-1.json").write_text(json.dumps(old.shard_states()[0]))
  resumed = DataLoader(TEXT_SOURCE, tok, spec)
  shards.ShardStateHandler().restore(tmp_path, args=shards.ShardStateRestore(resumed))
  for want in expected[2:]:
    np.testing.assert_array_equal(next(resumed)["tokens"], want["tokens"])


def test_ranges_cover_the_records_and_bad_counts_are_clear():
  ranges = [shards.record_range(10, s, 4) for s in range(4)]
  assert ranges == [(0, 2), (2, 5), (5, 7), (7, 10)]
  assert list(shards.owned(1, 2, 4)) == [2, 3]
  assert shards.count(0, 2, 8) == 2
  with pytest.raises(CardjaxError, match="cannot be dealt to 4 hosts.*1, 2, 3, 6"):
    shards.count(6, 4, 12)
  with pytest.raises(CardjaxError, match="batch_size=6 is not divisible by data.shards=4"):
    shards.count(4, 2, 6)
  with pytest.raises(CardjaxError, match="fewer than its 4 data shards"):
    shards.record_range(3, 0, 4)


def test_a_resume_on_hosts_that_cannot_share_the_shards_is_one_clear_error(monkeypatch):
  import jax

  from cardjax.train import loop

  class Saved:
    def data_shards(self, step):
      return 4

  config = type("C", (), {"data": type("D", (), {"shards": 0})()})()
  monkeypatch.setattr(jax, "process_count", lambda: 3)
  with pytest.raises(CardjaxError, match="4 shards.*resume it on 1, 2, 4 hosts"):
    loop._resumed_shards(config, Saved(), 10)
  monkeypatch.setattr(jax, "process_count", lambda: 2)
  assert loop._resumed_shards(config, Saved(), 10) == {"shards": 4}
  assert loop._resumed_shards(config, Saved(), None) == {}
