"""The tfds builders of the data layer: real (small) builds into tmp_path, read back."""

from __future__ import annotations

import json
import logging

import pytest

from cardjax.data import arith
from cardjax.data.builders import (BUILDERS, build, decode, load_source, make_builder,
                                   make_config)
from cardjax.data.builders.common import in_validation
from cardjax.data.builders.python_stdlib import stdlib_files
from cardjax.errors import CardjaxError, ConfigError


def read_all(name, data_dir, **options) -> dict[str, list[dict]]:
  """Every split of the dataset (built here unless it already is), decoded."""
  splits = build(name, data_dir, **options).info.splits.keys()
  out = {}
  for split in splits:
    src = load_source(name, split, data_dir, **options)
    out[split] = [decode(src[i]) for i in range(len(src))]
  return out


def write(path, data):
  path.parent.mkdir(parents=True, exist_ok=True)
  path.write_bytes(data if isinstance(data, bytes) else data.encode("utf-8"))
  return path


# --- text_corpus ---------------------------------------------------------------------------


@pytest.fixture
def corpus(tmp_path):
  src = tmp_path / "src"
  write(src / "notes.txt", "Hello, wörld.\nSecond line.\n")
  write(src / "pkg" / "code.py", "def f(x):\n  return x + 1\n")
  write(src / "pkg" / "deep" / "more.py", "print('deep')\n")
  write(src / "empty.txt", "")
  write(src / "blank.txt", "  \n\n")
  write(src / "data.jsonl", '{"text": "first record", "id": 1}\n\n{"text": ""}\n'
                            '{"text": "fourth line"}\n')
  return src


def test_text_corpus_contents_sources_and_counts(corpus, tmp_path, caplog):
  opts = dict(paths=f"{corpus}/*.txt,{corpus}/**/*.py,{corpus}/data.jsonl",
              validation_percent="40")  # CLI-style strings
  with caplog.at_level(logging.INFO, logger="cardjax.data"):
    builder = build("text_corpus", tmp_path / "tfds", **opts)
  splits = read_all("text_corpus", tmp_path / "tfds", **opts)
  got = {ex["source"]: (split, ex["text"]) for split, exs in splits.items() for ex in exs}
  expected = {
      "notes.txt": "Hello, wörld.\nSecond line.\n",
      "pkg/code.py": "def f(x):\n  return x + 1\n",
      "pkg/deep/more.py": "print('deep')\n",
      "data.jsonl:1": "first record",
      "data.jsonl:4": "fourth line",
  }
  assert {s: t for s, (_, t) in got.items()} == expected
  for source, (split, _) in got.items():  # split = stable hash of the file's relative path
    file = source.split(":")[0]
    assert split == ("validation" if in_validation(file, 40) else "train")
  assert set(splits) == {"train", "validation"}  # with these names, both get files
  # empty.txt, blank.txt and the empty jsonl record: counted in metadata and the log.
  meta = builder.info.metadata
  assert sum(m.get("empty", 0) for m in meta.values()) == 3
  assert sum(m["files"] for m in meta.values()) == 6
  for split, m in meta.items():
    assert f"text_corpus {split}: {m['examples']} examples from {m['files']} files; " \
        f"skipped {m.get('empty', 0)} empty" in caplog.text


@pytest.mark.parametrize("name", ["text_corpus", "sft_jsonl"])
def test_record_order_does_not_depend_on_where_the_files_lie(tmp_path, name):
  """One corpus copied into two folders builds to the same records in the same order
  (tfds orders records by a hash of the example key: keys carry relative paths)."""
  got = []
  for folder in ("a", "somewhere/else/b"):
    for i in range(12):
      write(tmp_path / folder / f"part{i % 3}" / f"f{i}.jsonl",
            "".join(json.dumps({"text": f"doc {i}.{j}", "prompt": f"q {i}.{j}",
                                "response": f"r {i}.{j}"}) + "\n" for j in range(4)))
    options = dict(paths=f"{tmp_path / folder}/**/*.jsonl")
    got.append(read_all(name, tmp_path / f"data_{len(got)}", **options))
  first = {split: [{k: v for k, v in r.items() if k != "source"} for r in rows]
           for split, rows in got[0].items()}
  second = {split: [{k: v for k, v in r.items() if k != "source"} for r in rows]
            for split, rows in got[1].items()}
  assert first == second and sum(len(r) for r in first.values()) == 48


def test_text_corpus_config_names_follow_options(corpus):
  a = make_config("text_corpus", paths=f"{corpus}/*.txt")
  b = make_config("text_corpus", paths=(f"{corpus}/*.txt",))
  c = make_config("text_corpus", paths=f"{corpus}/*.txt", validation_percent=5)
  d = make_config("text_corpus", paths=f"{corpus}/*.py")
  assert a.name == b.name
  assert len({a.name, c.name, d.name}) == 3
  assert a.name.startswith("files1_val2_") and c.name.startswith("files1_val5_")


def test_text_corpus_non_utf8(tmp_path):
  src = tmp_path / "src"
  write(src / "good.txt", "fine text")
  write(src / "bad.txt", b"ok \xff\xfe then more")
  paths = f"{src}/*.txt"
  with pytest.raises(CardjaxError, match=r"bad\.txt.*byte offset 3.*on_decode_error=replace"):
    build("text_corpus", tmp_path / "tfds", paths=paths)

  replaced = read_all("text_corpus", tmp_path / "tfds", paths=paths, on_decode_error="replace")
  texts = {ex["source"]: ex["text"] for exs in replaced.values() for ex in exs}
  assert texts == {"good.txt": "fine text", "bad.txt": "ok \ufffd\ufffd then more"}

  build("text_corpus", tmp_path / "tfds", paths=paths, on_decode_error="skip")
  builder = make_builder("text_corpus", tmp_path / "tfds", paths=paths, on_decode_error="skip")
  skipped = read_all("text_corpus", tmp_path / "tfds", paths=paths, on_decode_error="skip")
  assert [ex["source"] for exs in skipped.values() for ex in exs] == ["good.txt"]
  assert sum(m.get("undecodable", 0) for m in builder.info.metadata.values()) == 1


def test_text_corpus_jsonl_errors(tmp_path):
  write(tmp_path / "bad.jsonl", '{"text": "ok"}\n{"text": oops}\n')
  with pytest.raises(CardjaxError, match=r"bad\.jsonl:2: invalid JSON"):
    build("text_corpus", tmp_path / "tfds", paths=str(tmp_path / "bad.jsonl"))
  write(tmp_path / "nofield.jsonl", '{"body": "x"}\n')
  with pytest.raises(CardjaxError, match=r"nofield\.jsonl:1: no string field 'text'.*body"):
    build("text_corpus", tmp_path / "tfds", paths=str(tmp_path / "nofield.jsonl"))
  write(tmp_path / "enc.jsonl", b'{"text": "a"}\n{"text": "\xc3"}\n')
  with pytest.raises(CardjaxError, match=r"enc\.jsonl:2: invalid UTF-8 at byte offset 24"):
    build("text_corpus", tmp_path / "tfds", paths=str(tmp_path / "enc.jsonl"))
  kept = read_all("text_corpus", tmp_path / "tfds", paths=str(tmp_path / "enc.jsonl"),
                  on_decode_error="skip", validation_percent=0)
  assert kept == {"train": [{"text": "a", "source": "enc.jsonl:1"}]}


def test_text_corpus_nothing_to_read(tmp_path):
  with pytest.raises(CardjaxError, match=r"no file matches .*nope/\*\.txt"):
    build("text_corpus", tmp_path / "tfds", paths=str(tmp_path / "nope" / "*.txt"))
  write(tmp_path / "e1.txt", "")
  write(tmp_path / "e2.txt", "\n")
  with pytest.raises(CardjaxError, match=r"no examples in the files matching .*\*\.txt"):
    build("text_corpus", tmp_path / "tfds", paths=str(tmp_path / "*.txt"))
  assert not list((tmp_path / "tfds").rglob("dataset_info.json"))  # nothing half-built
  with pytest.raises(CardjaxError, match="is not built"):
    load_source("text_corpus", "train", tmp_path / "tfds", paths=str(tmp_path / "*.txt"))


# --- python_stdlib -------------------------------------------------------------------------


def test_python_stdlib_subset_and_stable_split(tmp_path):
  chosen = stdlib_files(30)
  assert len(chosen) == 30
  expected = {}
  for path, rel in chosen:
    try:
      with open(path, "rb") as f:  # bytes: the builder keeps \r\n as it is
        text = f.read().decode("utf-8")
    except UnicodeDecodeError:
      continue  # dropped by on_decode_error=skip
    if text.strip():
      expected[rel] = text.removeprefix("\ufeff")
  runs = []
  for d in ("a", "b"):
    build("python_stdlib", tmp_path / d, max_files=30, validation_percent=20)
    runs.append(read_all("python_stdlib", tmp_path / d, max_files=30, validation_percent=20))
  first = runs[0]
  assert set(first) == {"train", "validation"}
  train = {ex["source"] for ex in first["train"]}
  val = {ex["source"] for ex in first["validation"]}
  assert not train & val
  assert train | val == set(expected)
  for split, exs in first.items():
    for ex in exs:
      assert ex["text"] == expected[ex["source"]]
      assert split == ("validation" if in_validation(ex["source"], 20) else "train")
  assert {s: sorted(e["source"] for e in x) for s, x in runs[1].items()} == {
      s: sorted(e["source"] for e in x) for s, x in first.items()}
  builder = make_builder("python_stdlib", tmp_path / "a", max_files=30, validation_percent=20)
  assert "python=3." in builder.builder_config.description


def test_python_stdlib_listing_excludes_installed_packages():
  rels = [rel for _, rel in stdlib_files()]
  assert len(rels) > 500 and "os.py" in rels and "json/decoder.py" in rels
  assert any(r.startswith("test/") for r in rels)
  banned = {"site-packages", "dist-packages", "__pycache__"}
  assert not any(banned & set(r.split("/")) for r in rels)


# --- sft_jsonl ----------------------------------------------------------------------------


def test_sft_jsonl_both_formats(tmp_path):
  write(tmp_path / "a.jsonl",
        json.dumps({"messages": [{"role": "system", "content": "Be brief."},
                                 {"role": "user", "content": "2+2?"},
                                 {"role": "assistant", "content": "4"}], "answer": "4"}) + "\n\n" +
        json.dumps({"prompt": "Capital of France?", "response": "Paris.", "extra": 1}) + "\n")
  write(tmp_path / "b.jsonl", json.dumps({"prompt": "3*3?", "response": "9", "answer": 9}) + "\n")
  got = read_all("sft_jsonl", tmp_path / "tfds", paths=f"{tmp_path}/*.jsonl")
  assert set(got) == {"train"}  # validation_percent defaults to 0
  by_first_user = {next(m["content"] for m in ex["messages"] if m["role"] == "user"): ex
                   for ex in got["train"]}
  assert by_first_user == {
      "2+2?": {"answer": "4", "messages": [{"role": "system", "content": "Be brief."},
                                          {"role": "user", "content": "2+2?"},
                                          {"role": "assistant", "content": "4"}]},
      "Capital of France?": {"answer": "", "messages": [
          {"role": "user", "content": "Capital of France?"},
          {"role": "assistant", "content": "Paris."}]},
      "3*3?": {"answer": "9", "messages": [{"role": "user", "content": "3*3?"},
                                          {"role": "assistant", "content": "9"}]},
  }


def test_sft_jsonl_validation_split(tmp_path):
  lines = [json.dumps({"prompt": f"q{i}", "response": f"r{i}"}) for i in range(40)]
  write(tmp_path / "c.jsonl", "\n".join(lines) + "\n")
  got = read_all("sft_jsonl", tmp_path / "tfds", paths=str(tmp_path / "c.jsonl"),
                 validation_percent=30)
  assert set(got) == {"train", "validation"}
  for split, exs in got.items():
    for ex in exs:
      i = int(ex["messages"][0]["content"][1:])
      assert split == ("validation" if in_validation(lines[i], 30) else "train")
  assert sorted(int(ex["messages"][0]["content"][1:]) for exs in got.values()
                for ex in exs) == list(range(40))


@pytest.mark.parametrize("line, match", [
    ('{"prompt": "x", "response": }', r"bad\.jsonl:2: invalid JSON"),
    ('{"messages": [{"role": "user", "content": "hi"}]}', r"bad\.jsonl:2: no assistant message"),
    ('{"messages": [{"role": "bot", "content": "hi"}]}', r"bad\.jsonl:2: message 0 has role 'bot'"),
    ('{"messages": [{"role": "assistant", "content": 5}]}', r"bad\.jsonl:2: message 0 .*string"),
    ('{"question": "x"}', r"bad\.jsonl:2: needs 'messages' or 'prompt' \+ 'response'"),
])
def test_sft_jsonl_bad_lines(tmp_path, line, match):
  good = json.dumps({"prompt": "p", "response": "r"})
  write(tmp_path / "bad.jsonl", f"{good}\n{line}\n")
  with pytest.raises(CardjaxError, match=match):
    build("sft_jsonl", tmp_path / "tfds", paths=str(tmp_path / "bad.jsonl"))


# --- arith_sft ----------------------------------------------------------------------------


def test_arith_sft_splits_are_disjoint_and_graded(tmp_path):
  opts = dict(train_size="300", test_size="40", seed="3")
  build("arith_sft", tmp_path, **opts)
  got = read_all("arith_sft", tmp_path, **opts)
  assert {k: len(v) for k, v in got.items()} == {"train": 300, "test": 40}
  questions = {k: {ex["messages"][0]["content"] for ex in v} for k, v in got.items()}
  assert len(questions["train"]) == 300 and len(questions["test"]) == 40
  assert not questions["train"] & questions["test"]
  for exs in got.values():
    for ex in exs:
      user, assistant = ex["messages"]
      assert (user["role"], assistant["role"]) == ("user", "assistant")
      assert arith.grade(assistant["content"], ex["answer"])
  # The test split depends on (seed, test_size) only.
  small = {**opts, "train_size": 10}
  build("arith_sft", tmp_path / "b", **small)
  other = read_all("arith_sft", tmp_path / "b", **small)
  assert {e["messages"][0]["content"] for e in other["test"]} == questions["test"]


def test_arith_sft_hard_level_and_the_easy_names_unchanged(tmp_path):
  from cardjax.data.builders.arith_sft import ArithSftConfig
  # The easy level's build names are those of the builds made before levels existed.
  assert ArithSftConfig().name == "train20000_test500_seed0_89c9b6d3bd"
  assert ArithSftConfig(level="easy", train_size=100, test_size=20, seed=3).name == \
      "train100_test20_seed3_0633add247"
  opts = dict(train_size="60", test_size="20", seed="1", level="hard")
  build("arith_sft", tmp_path, **opts)
  got = read_all("arith_sft", tmp_path, **opts)
  steps = [len(arith.STEP.findall(ex["messages"][1]["content"])) for ex in got["train"]]
  assert min(steps) >= 4 and len(got["test"]) == 20
  assert not ({e["messages"][0]["content"] for e in got["train"]}
              & {e["messages"][0]["content"] for e in got["test"]})
  with pytest.raises(ConfigError, match="level must be one of easy, hard"):
    ArithSftConfig(level="medium")


def test_arith_sft_feeds_grain(tmp_path):
  import grain
  build("arith_sft", tmp_path, train_size=8, test_size=2)
  src = load_source("arith_sft", "train", tmp_path, train_size=8, test_size=2)
  ds = grain.MapDataset.source(src).map(decode)
  assert len(ds) == 8 and ds[0]["messages"][1]["role"] == "assistant"


# --- API errors -----------------------------------------------------------------------------


def test_unknown_builder_and_option(tmp_path):
  with pytest.raises(CardjaxError, match=r"unknown dataset 'nope'.*text_corpus.*arith_sft"):
    make_config("nope")
  with pytest.raises(CardjaxError, match=r"arith_sft has no option size; .*train_size"):
    make_config("arith_sft", size=3)
  with pytest.raises(CardjaxError, match=r"train_size .* must be an integer, got 'many'"):
    make_config("arith_sft", train_size="many")
  with pytest.raises(CardjaxError, match=r"on_decode_error must be one of"):
    make_config("text_corpus", paths="x", on_decode_error="ignore")
  assert make_config("text_corpus", paths=tmp_path / "x.txt").paths == (str(tmp_path / "x.txt"),)
  cfg = make_config("arith_sft", train_size="20000")
  assert cfg.train_size == 20000 and cfg.name.startswith("train20000_test500_seed0_")
  assert set(BUILDERS) == {"text_corpus", "python_stdlib", "sft_jsonl", "arith_sft"}


def test_load_unbuilt_and_unknown_split(tmp_path):
  with pytest.raises(CardjaxError, match=r"dataset arith_sft \(options train_size=10, "
                     r"test_size=2\) is not built in .*missing; run `cardjax data build "
                     r"arith_sft --data-dir .*missing --train-size 10 --test-size 2`"):
    load_source("arith_sft", "train", tmp_path / "missing", train_size=10, test_size=2)
  build("arith_sft", tmp_path, train_size=10, test_size=2)
  with pytest.raises(CardjaxError, match=r"not built"):  # other options: another build
    load_source("arith_sft", "train", tmp_path, train_size=11, test_size=2)
  with pytest.raises(CardjaxError, match=r"no split 'validation'; available splits: "
                     r"(train, test|test, train)$"):
    load_source("arith_sft", "validation", tmp_path, train_size=10, test_size=2)


def test_arith_step_accuracy_checks_each_worked_step():
  from cardjax.data import arith
  for i in range(20):
    response = arith.problem(0, i)["response"]
    correct, written = arith.step_accuracy(response)
    assert correct == written >= 2  # the reference works every step out right
  assert arith.step_accuracy("5 + 4 = 9. 9 * 3 = 28. 28 - 30 = -2. The answer is -2.") == (2, 3)
  assert arith.step_accuracy("The answer is 7.") == (0, 0)
