"""text_corpus built on Apache Beam (DirectRunner, two worker processes) stores the records of
the single-process build, all of them, in the same order; and Beam is refused where a
builder has no Beam build."""

from __future__ import annotations

import pytest

from cardjax.data import builders
from cardjax.errors import ConfigError
from test_data_buckets import all_records, mixed_corpus

BEAM = "--direct_num_workers=2 --direct_running_mode=multi_processing"


def test_beam_build_equals_single_process_build(tmp_path):
  corpus = mixed_corpus(tmp_path / "corpus")
  for i in range(30):  # more files, so the two workers both get some
    (corpus / "many" / f"{i:02d}.md").parent.mkdir(exist_ok=True)
    (corpus / "many" / f"{i:02d}.md").write_text(f"# page {i}\n" + "body " * i)
  options = {"paths": f"{corpus}/**/*.*", "validation_percent": 30}
  single = builders.build("text_corpus", tmp_path / "single", **options)
  beam = builders.build("text_corpus", tmp_path / "beam", beam_runner="DirectRunner",
                        beam_options=BEAM, **options)
  assert set(beam.info.splits) == set(single.info.splits) == {"train", "validation"}
  expected = all_records(tmp_path / "single", **options)
  assert all_records(tmp_path / "beam", **options) == expected
  # The workers' counts are stored as the single-process build stores its own.
  assert dict(beam.info.metadata) == dict(single.info.metadata)
  assert sum(map(len, expected.values())) > 100
  assert list((tmp_path / "beam").rglob("*.array_record-*"))  # the same file format


def test_beam_needs_a_builder_with_a_beam_build(tmp_path):
  with pytest.raises(ConfigError, match=r"dataset arith_sft has no Beam build \(datasets "
                                        r"with one: text_corpus.*drop --beam-runner"):
    builders.build("arith_sft", tmp_path, beam_runner="DirectRunner")


def test_distributed_runner_cannot_write_a_bucket_data_dir(tmp_path):
  with pytest.raises(ConfigError, match=r"--beam-runner DataflowRunner with data_dir "
                                        r"gs://b/tfds: .*ArrayRecord writes only local files"):
    builders.build("text_corpus", "gs://b/tfds", beam_runner="DataflowRunner",
                   paths=str(tmp_path / "*.txt"))


def test_beam_build_from_and_into_a_bucket(tmp_path, monkeypatch):
  from cloud_emulators import emulated
  from test_data_buckets import upload_folder

  monkeypatch.setenv("CARDJAX_CACHE", str(tmp_path / "cache"))
  corpus = mixed_corpus(tmp_path / "corpus")
  local = {"paths": f"{corpus}/**/*.*", "validation_percent": 30}
  builders.build("text_corpus", tmp_path / "single", **local)
  expected = all_records(tmp_path / "single", **local)
  with emulated("gs") as (_, root):  # the workers inherit the emulator's variables
    upload_folder(corpus, f"{root}/corpus")
    remote = {"paths": f"{root}/corpus/**/*.*", "validation_percent": 30}
    builders.build("text_corpus", f"{root}/tfds", beam_runner="DirectRunner",
                   beam_options=BEAM, **remote)
    monkeypatch.setenv("CARDJAX_CACHE", str(tmp_path / "cache2"))  # read the bucket's copy
    assert all_records(f"{root}/tfds", **remote) == expected


def test_beam_build_that_lost_records_fails(tmp_path, monkeypatch):
  from cardjax.data.builders import text_corpus
  from cardjax.errors import CardjaxError

  counts = text_corpus.beam_counts

  def one_more_read(result):  # as if a worker's output had been dropped
    found = counts(result)
    found["train"]["examples"] += 1
    return found

  monkeypatch.setattr(text_corpus, "beam_counts", one_more_read)
  corpus = mixed_corpus(tmp_path / "corpus")
  options = {"paths": f"{corpus}/**/*.*", "validation_percent": 0}
  with pytest.raises(CardjaxError, match=r"the Beam build stored (\d+) examples of split "
                                         r"train but its workers read (\d+); .*build again"):
    builders.build("text_corpus", tmp_path / "tfds", beam_runner="DirectRunner",
                   beam_options="--direct_running_mode=in_memory", **options)
  with pytest.raises(CardjaxError, match="is not built"):  # nothing half-made is used
    builders.load_source("text_corpus", "train", tmp_path / "tfds", **options)


def test_sft_jsonl_beam_build_equals_single_process_build(tmp_path):
  import json

  (tmp_path / "sft").mkdir()
  for f in range(4):
    lines = [{"prompt": f"q{f}.{i}", "response": f"a{f}.{i}", "answer": i} for i in range(15)]
    (tmp_path / "sft" / f"{f}.jsonl").write_text("".join(json.dumps(x) + "\n" for x in lines))
  options = {"paths": str(tmp_path / "sft" / "*.jsonl"), "validation_percent": 25}
  builders.build("sft_jsonl", tmp_path / "single", **options)
  builders.build("sft_jsonl", tmp_path / "beam", beam_runner="DirectRunner", beam_options=BEAM,
                 **options)
  for split in ("train", "validation"):
    single = builders.load_source("sft_jsonl", split, tmp_path / "single", **options)
    beam = builders.load_source("sft_jsonl", split, tmp_path / "beam", **options)
    assert len(single) == len(beam) > 0
    assert [beam[i] for i in range(len(beam))] == [single[i] for i in range(len(single))]


def test_sft_jsonl_beam_build_that_lost_records_fails(tmp_path, monkeypatch):
  """As text_corpus: the workers' count of conversations read must equal what was stored."""
  import json

  from cardjax.data.builders import sft_jsonl
  from cardjax.errors import CardjaxError

  counts = sft_jsonl.beam_counts

  def one_more_read(result, prefix):  # as if a worker's output had been dropped
    found = counts(result, prefix)
    found["train"]["read"] += 1
    return found

  monkeypatch.setattr(sft_jsonl, "beam_counts", one_more_read)
  (tmp_path / "sft").mkdir()
  for f in range(2):
    lines = [{"prompt": f"q{f}.{i}", "response": f"a{f}.{i}"} for i in range(5)]
    (tmp_path / "sft" / f"{f}.jsonl").write_text("".join(json.dumps(x) + "\n" for x in lines))
  options = {"paths": str(tmp_path / "sft" / "*.jsonl")}
  with pytest.raises(CardjaxError, match=r"dataset sft_jsonl: the Beam build stored 10 "
                                         r"examples of split train but its workers read 11; "
                                         r".*build again"):
    builders.build("sft_jsonl", tmp_path / "tfds", beam_runner="DirectRunner",
                   beam_options="--direct_running_mode=in_memory", **options)
  with pytest.raises(CardjaxError, match="is not built"):  # nothing half-made is used
    builders.load_source("sft_jsonl", "train", tmp_path / "tfds", **options)
