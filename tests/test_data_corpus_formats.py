"""text_corpus reads one corpus alike from .jsonl, .jsonl.gz, .jsonl.zst, .parquet and .txt."""

from __future__ import annotations

import gzip
import json

import pyarrow as pa
import pyarrow.parquet as pq
import pytest
import zstandard

from cardjax.data.builders import build, decode, load_source
from cardjax.errors import CardjaxError

# Unicode, an empty and a blank text, multi-line texts (one with CRLF), JSON-hostile quotes.
TEXTS = [f"text {i}: {'wörd ' * (i % 4)}✓" for i in range(24)] + [
    "", "  \n", "line one\nline two\n", "crlf\r\nline", 'quotes "and" \\ back', "日本語 🙂"]
KEPT = [t for t in TEXTS if t.strip()]
LINE_FORMATS = ["corpus.jsonl", "corpus.jsonl.gz", "corpus.jsonl.zst", "corpus.parquet"]


def jsonl_bytes(texts, field="text") -> bytes:
  lines = (json.dumps({field: t, "id": i}, ensure_ascii=False) for i, t in enumerate(texts))
  return "".join(line + "\n" for line in lines).encode("utf-8")


def write_corpus(folder, name, texts=TEXTS, field="text"):
  """`texts` as the format that `name` ends with; returns the path (or glob) to build."""
  folder.mkdir(parents=True, exist_ok=True)
  path = folder / name
  if name.endswith(".parquet"):
    table = pa.table({"id": list(range(len(texts))), field: texts})
    pq.write_table(table, path, row_group_size=7)  # several row groups
  elif name.endswith(".gz"):
    path.write_bytes(gzip.compress(jsonl_bytes(texts, field)))
  elif name.endswith(".zst"):
    path.write_bytes(zstandard.ZstdCompressor().compress(jsonl_bytes(texts, field)))
  elif name.endswith(".jsonl"):
    path.write_bytes(jsonl_bytes(texts, field))
  else:  # one .txt file per text
    for i, text in enumerate(texts):
      (folder / f"{i:02d}.txt").write_bytes(text.encode("utf-8"))
    return str(folder / "*.txt")
  return str(path)


def built_train(data_dir, paths, **options):
  """(records of the train split in file order, the split's counts)."""
  builder = build("text_corpus", data_dir, paths=paths, validation_percent=0, **options)
  src = load_source("text_corpus", "train", data_dir, paths=paths, validation_percent=0,
                    **options)
  records = [decode(src[i]) for i in range(len(src))]
  return records, dict(builder.info.metadata["train"])


def in_file_order(records):
  """Records sorted by line / row number (or by file name for .txt files)."""
  def where(r):
    rel, _, number = r["source"].rpartition(":")
    return (rel, int(number)) if number.isdigit() else (r["source"], 0)
  return sorted(records, key=where)


def test_every_format_builds_the_same_records(tmp_path):
  counts = {}
  for name in LINE_FORMATS:
    paths = write_corpus(tmp_path / name.replace(".", "_"), name)
    records, counts[name] = built_train(tmp_path / "tfds", paths)
    ordered = in_file_order(records)
    assert [r["text"] for r in ordered] == KEPT, name
    # Keys and sources: the relative path and the line (row) number, counted from 1 over
    # the whole file, blank texts included.
    numbers = [i + 1 for i, t in enumerate(TEXTS) if t.strip()]
    assert [r["source"] for r in ordered] == [f"{name}:{n}" for n in numbers], name
  assert pq.ParquetFile(tmp_path / "corpus_parquet" / "corpus.parquet").num_row_groups > 1
  expected = {"files": 1, "examples": len(KEPT), "empty": len(TEXTS) - len(KEPT)}
  assert all(c == expected for c in counts.values()), counts
  records, txt_counts = built_train(tmp_path / "tfds", write_corpus(tmp_path / "txt", "txt"))
  assert [r["text"] for r in in_file_order(records)] == KEPT
  assert txt_counts == {**expected, "files": len(TEXTS)}


def test_parquet_column_is_the_text_field(tmp_path):
  paths = write_corpus(tmp_path, "corpus.parquet", texts=["a", "b"], field="body")
  with pytest.raises(CardjaxError, match=r"corpus\.parquet: no column 'text' \(has: id, body\); "
                                         r"set the text_field option"):
    build("text_corpus", tmp_path / "tfds", paths=paths)
  records, _ = built_train(tmp_path / "tfds", paths, text_field="body")
  assert [r["text"] for r in in_file_order(records)] == ["a", "b"]
  pq.write_table(pa.table({"text": [1, 2]}), tmp_path / "ints.parquet")
  with pytest.raises(CardjaxError, match=r"ints\.parquet: column 'text' holds int64, not text"):
    build("text_corpus", tmp_path / "tfds", paths=str(tmp_path / "ints.parquet"))


@pytest.mark.parametrize("name, kind", [("corpus.jsonl.gz", "gzip"),
                                        ("corpus.jsonl.zst", "zstd")])
def test_corrupt_compressed_jsonl(tmp_path, name, kind):
  path = tmp_path / name
  write_corpus(tmp_path, name)
  path.write_bytes(path.read_bytes()[:-20])  # truncated
  with pytest.raises(CardjaxError, match=rf"{name}: cannot decompress it as {kind} .*"
                                         "truncated or corrupt"):
    build("text_corpus", tmp_path / "tfds", paths=str(path))
  path.write_bytes(b"not compressed at all\n" * 4)
  with pytest.raises(CardjaxError, match=rf"{name}: cannot decompress it as {kind}"):
    build("text_corpus", tmp_path / "tfds", paths=str(path))


def test_compressed_jsonl_reports_lines_as_jsonl_does(tmp_path):
  gz = tmp_path / "bad.jsonl.gz"
  gz.write_bytes(gzip.compress(b'{"text": "ok"}\n{"text": oops}\n'))
  with pytest.raises(CardjaxError, match=r"bad\.jsonl\.gz:2: invalid JSON"):
    build("text_corpus", tmp_path / "tfds", paths=str(gz))
  zst = tmp_path / "enc.jsonl.zst"
  zst.write_bytes(zstandard.ZstdCompressor().compress(b'{"text": "a"}\n{"text": "\xc3"}\n'))
  with pytest.raises(CardjaxError, match=r"enc\.jsonl\.zst:2: invalid UTF-8 at byte offset 24"):
    build("text_corpus", tmp_path / "tfds", paths=str(zst))
  records, counts = built_train(tmp_path / "tfds", str(zst), on_decode_error="skip")
  assert records == [{"text": "a", "source": "enc.jsonl.zst:1"}]
  assert counts == {"files": 1, "examples": 1, "undecodable": 1}


def test_parquet_bad_utf8_follows_on_decode_error(tmp_path):
  path = tmp_path / "enc.parquet"
  pq.write_table(pa.table({"text": pa.array([b"a", b"\xc3", None], pa.binary())}), path)
  with pytest.raises(CardjaxError, match=r"enc\.parquet:2: invalid UTF-8 at byte offset 0"):
    build("text_corpus", tmp_path / "tfds", paths=str(path))
  records, counts = built_train(tmp_path / "tfds", str(path), on_decode_error="skip")
  assert records == [{"text": "a", "source": "enc.parquet:1"}]
  assert counts == {"files": 1, "examples": 1, "undecodable": 1, "empty": 1}  # null: empty


def test_compressed_text_files_are_one_text_each(tmp_path):
  (tmp_path / "c").mkdir()
  for i, text in enumerate(KEPT[:5]):
    data = text.encode("utf-8")
    packed = gzip.compress(data) if i % 2 else zstandard.ZstdCompressor().compress(data)
    (tmp_path / "c" / f"{i:02d}.txt{'.gz' if i % 2 else '.zst'}").write_bytes(packed)
  records, counts = built_train(tmp_path / "tfds", str(tmp_path / "c" / "*"))
  assert [r["text"] for r in in_file_order(records)] == KEPT[:5]
  assert counts == {"files": 5, "examples": 5}
  (tmp_path / "c" / "00.txt.zst").write_bytes(b"not zstd")
  with pytest.raises(CardjaxError, match=r"00\.txt\.zst: cannot decompress it as zstd"):
    build("text_corpus", tmp_path / "tfds2", paths=str(tmp_path / "c" / "*"))


def test_nested_text_field_in_parquet_and_jsonl(tmp_path):
  texts = ["a", None, "b"]
  pq.write_table(pa.table({"id": [1, 2, 3],
                           "meta": [{"lang": "en", "text": t} for t in texts]}),
                 tmp_path / "n.parquet")
  (tmp_path / "n.jsonl").write_text(
      "".join(json.dumps({"meta": {"text": t or ""}}) + "\n" for t in texts))
  for name in ("n.parquet", "n.jsonl"):
    records, counts = built_train(tmp_path / "tfds", str(tmp_path / name),
                                  text_field="meta.text")
    assert [r["text"] for r in in_file_order(records)] == ["a", "b"], name
    assert counts == {"files": 1, "examples": 2, "empty": 1}, name
  with pytest.raises(CardjaxError, match=r"n\.parquet: no column 'meta\.body' \(has: id, "
                                         r"meta\.lang, meta\.text\)"):
    build("text_corpus", tmp_path / "tfds", paths=str(tmp_path / "n.parquet"),
          text_field="meta.body")
