"""Streaming readers of the record formats of text_corpus: JSONL (plain, gzip, zstd), Parquet.

They yield raw values only (lines as bytes; Parquet texts as bytes, or None for a null), so
text_corpus applies one decoding, parsing and counting policy to every format. Nothing
reads a whole file: compressed JSONL is decompressed as a stream, Parquet is read in small
batches of one column, row group by row group.
"""

from __future__ import annotations

import gzip
import zlib
from collections.abc import Iterator

import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq
import zstandard

from cardjax.data.files import open_binary
from cardjax.errors import CardjaxError

JSONL_SUFFIXES = (".jsonl", ".jsonl.gz", ".jsonl.zst")
PARQUET_SUFFIX = ".parquet"
_CHUNK_BYTES = 1 << 20  # compressed bytes read at a time
# Rows per Parquet batch: small, since one row may be a whole book.
_BATCH_ROWS = 256
# What a truncated or corrupt compressed stream raises (BadGzipFile is an OSError).
_CORRUPT = (OSError, EOFError, zlib.error, zstandard.ZstdError)


def is_jsonl(path: str) -> bool:
  return path.lower().endswith(JSONL_SUFFIXES)


def is_parquet(path: str) -> bool:
  return path.lower().endswith(PARQUET_SUFFIX)


def _zstd_chunks(path: str) -> Iterator[bytes]:
  """The decompressed data of a .zst file, frame after frame (files made by concatenating
  frames are common). Not zstandard's stream_reader: it ends a truncated file early and
  silently, which would drop the tail of a corpus."""
  dctx = zstandard.ZstdDecompressor()
  with open_binary(path) as f:
    frame, started = dctx.decompressobj(), False
    while chunk := f.read(_CHUNK_BYTES):
      while chunk:
        started = True
        if out := frame.decompress(chunk):
          yield out
        if not frame.eof:
          break
        chunk, frame, started = frame.unused_data, dctx.decompressobj(), False
  if started:
    raise EOFError("the file ends inside a zstd frame")


def _lines(chunks: Iterator[bytes]) -> Iterator[bytes]:
  """Lines (with their b"\n", as iterating a binary file gives them) of a byte stream."""
  pending = []  # pieces of the current line; joined once, so long lines stay linear
  for chunk in chunks:
    *ended, rest = chunk.split(b"\n")
    for piece in ended:
      yield b"".join([*pending, piece, b"\n"])
      pending.clear()
    if rest:
      pending.append(rest)
  if pending:
    yield b"".join(pending)


def _raw_lines(path: str) -> Iterator[bytes]:
  if path.lower().endswith(".zst"):
    yield from _lines(_zstd_chunks(path))
    return
  with open_binary(path) as f:
    if path.lower().endswith(".gz"):
      with gzip.GzipFile(fileobj=f, mode="rb") as g:
        yield from g
    else:
      yield from f


def file_bytes(path: str) -> bytes:
  """The content of a one-text file; a .gz or .zst file (not .jsonl.*) decompressed."""
  lowered = path.lower()
  try:
    if lowered.endswith(".zst"):
      return b"".join(_zstd_chunks(path))
    with open_binary(path) as f:
      if lowered.endswith(".gz"):
        with gzip.GzipFile(fileobj=f, mode="rb") as g:
          return g.read()
      return f.read()
  except _CORRUPT as e:
    if not lowered.endswith((".gz", ".zst")):
      raise
    kind = "gzip" if lowered.endswith(".gz") else "zstd"
    raise CardjaxError(
        f"{path}: cannot decompress it as {kind} ({type(e).__name__}: {e}); the file is "
        f"truncated or corrupt, or not {kind}: re-create it, or leave it out of paths") from None


def jsonl_lines(path: str) -> Iterator[bytes]:
  """The raw lines (with their newline) of a .jsonl, .jsonl.gz or .jsonl.zst file."""
  compressed = not path.lower().endswith(".jsonl")
  try:
    yield from _raw_lines(path)
  except _CORRUPT as e:
    if not compressed:
      raise
    kind = "gzip" if path.lower().endswith(".gz") else "zstd"
    raise CardjaxError(
        f"{path}: cannot decompress it as {kind} ({type(e).__name__}: {e}); the file is "
        f"truncated or corrupt, or not {kind}: re-create it, or leave it out of paths") from None


def _unreadable(path: str, e: Exception) -> CardjaxError:
  return CardjaxError(
      f"{path}: cannot read it as Parquet ({type(e).__name__}: {e}); the file is truncated "
      "or corrupt: re-create it, or leave it out of paths")


def _column_type(schema, column: str):
  """(arrow type, struct field names below the top column) of `column`: a top-level name,
  or a dotted path into struct columns ("meta.text"); (None, ()) when there is none."""
  if column in schema.names:
    return schema.field(column).type, ()
  top, *inside = column.split(".")
  if not inside or top not in schema.names:
    return None, ()
  kind = schema.field(top).type
  for name in inside:
    if not pa.types.is_struct(kind) or kind.get_field_index(name) < 0:
      return None, ()
    kind = kind.field(name).type
  return kind, tuple(inside)


def _leaf_names(schema) -> list[str]:
  """Column names, struct columns spelled out as a.b."""
  def walk(prefix, kind):
    if pa.types.is_struct(kind):
      for field in kind:
        yield from walk(f"{prefix}.{field.name}", field.type)
    else:
      yield prefix
  return [name for field in schema for name in walk(field.name, field.type)]


def parquet_values(path: str, column: str) -> Iterator[tuple[int, bytes | None]]:
  """(row number from 1 over the whole file, raw text or None) of one column of a Parquet
  file; the column must hold strings or bytes."""
  with open_binary(path) as f:
    # On a file object (a bucket file too) pyarrow reads the footer, then only the byte
    # ranges of the column's chunks it iterates: never the whole file.
    yield from _parquet_column(f, path, column)


def _parquet_column(f, path: str, column: str) -> Iterator[tuple[int, bytes | None]]:
  try:
    pf = pq.ParquetFile(f)
  except (pa.ArrowException, OSError) as e:
    raise _unreadable(path, e) from None
  with pf:
    schema = pf.schema_arrow
    kind, inside = _column_type(schema, column)
    if kind is None:
      raise CardjaxError(
          f"{path}: no column {column!r} (has: {', '.join(_leaf_names(schema))}); set the "
          "text_field option to the column that holds the text (a.b for field b of struct "
          "column a)")
    if not (pa.types.is_string(kind) or pa.types.is_large_string(kind)
            or pa.types.is_binary(kind) or pa.types.is_large_binary(kind)):
      raise CardjaxError(
          f"{path}: column {column!r} holds {kind}, not text; set the text_field option "
          "to a string column")
    row = 0
    try:
      for batch in pf.iter_batches(batch_size=_BATCH_ROWS, columns=[column]):
        values = batch.column(0)
        for name in inside:  # a nested field: only its leaf is read, then taken out
          values = pc.struct_field(values, name)
        # As bytes, so undecodable text gets the same on_decode_error handling as files.
        for value in values.cast(pa.large_binary()).to_pylist():
          row += 1
          yield row, value
    except (pa.ArrowException, OSError) as e:
      raise _unreadable(path, e) from None
