"""How fast text_corpus builds a FineWeb-like corpus (Parquet shards of web text), in MB of
input text a second, single-process or on a Beam runner.

    from cardjax.data.build_speed import measure
    measure(mb=64, beam_runner="DirectRunner",
            beam_options="--direct_num_workers=2 --direct_running_mode=multi_processing")

The corpus is synthetic (random words, document lengths like web pages), written once per
call into a temporary folder; only the build is timed.
"""

from __future__ import annotations

import os
import random
import tempfile
import time

import pyarrow as pa
import pyarrow.parquet as pq

from cardjax.data import builders

_WORDS = [f"w{i:x}" for i in range(4096)]


def write_corpus(folder: str, mb: float, shards: int = 8, seed: int = 0) -> int:
  """Parquet shards of ~`mb` MB of text in `folder` (a "text" column, row groups of 1000
  rows, as FineWeb's); returns the UTF-8 bytes of text written."""
  rng = random.Random(seed)
  os.makedirs(folder, exist_ok=True)
  per_shard, total = mb * 1e6 / shards, 0
  for shard in range(shards):
    texts, size = [], 0
    while size < per_shard:
      text = " ".join(rng.choices(_WORDS, k=rng.randint(50, 1500)))
      texts.append(text)
      size += len(text)
    pq.write_table(pa.table({"id": list(range(len(texts))), "text": texts}),
                   os.path.join(folder, f"shard-{shard:05d}.parquet"), row_group_size=1000)
    total += size
  return total


def measure(mb: float = 64, beam_runner: str | None = None, beam_options: str = "",
            workdir: str | None = None) -> dict:
  """Build a fresh ~`mb` MB corpus; returns {"mb", "seconds", "mb_per_s", "examples",
  "runner"}."""
  with tempfile.TemporaryDirectory(dir=workdir) as tmp:
    size = write_corpus(os.path.join(tmp, "corpus"), mb)
    start = time.perf_counter()
    builder = builders.build("text_corpus", os.path.join(tmp, "tfds"),
                             beam_runner=beam_runner, beam_options=beam_options,
                             paths=os.path.join(tmp, "corpus", "*.parquet"))
    seconds = time.perf_counter() - start
  examples = sum(s.num_examples for s in builder.info.splits.values())
  return {"mb": size / 1e6, "seconds": seconds, "mb_per_s": size / 1e6 / seconds,
          "examples": examples, "runner": beam_runner or "single process"}


if __name__ == "__main__":
  import json
  import sys

  runner = sys.argv[2] if len(sys.argv) > 2 else None
  print(json.dumps(measure(float(sys.argv[1]) if len(sys.argv) > 1 else 64, runner,
                           " ".join(sys.argv[3:]))))
