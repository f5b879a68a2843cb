"""Attention patterns: the share of score tiles a block-sparse kernel never visits.

  python benchmarks/attention.py [--lengths 512,2048,8192] [--tiles 128,512]

For each cardjax mask pattern, one training row of L data tokens laid out as the objective
lays it out (MARS and BD3LM read 2L tokens: two streams), classified tile by tile with the
mask predicate (cardjax/attention/tiles.py): the share of EMPTY tiles (skipped), and of FULL
ones (no mask work). Machine independent: a property of the pattern and the tile size.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from cardjax.attention import MaskSpec  # noqa: E402
from cardjax.attention.tiles import FULL, row_layout, skipped_fraction, tile_table  # noqa: E402

# (name, mask, layout kind, packed documents)
PATTERNS = [("causal (AR, CARD)", MaskSpec("causal"), "causal", 1),
            ("causal, 4 packed documents", MaskSpec("causal"), "causal", 4),
            ("bidirectional (MDLM)", MaskSpec("bidirectional"), "bidirectional", 1),
            ("MARS dual stream, B = 4", MaskSpec("dual_stream", 4), "dual_stream", 1),
            ("BD3LM, B = 16", MaskSpec("bd3lm", 16), "bd3lm", 1),
            ("block causal, B = 16", MaskSpec("block_causal", 16), "block_causal", 1)]


def main() -> None:
  parser = argparse.ArgumentParser(description=__doc__,
                                   formatter_class=argparse.RawDescriptionHelpFormatter)
  parser.add_argument("--lengths", default="512,2048,8192")
  parser.add_argument("--tiles", default="128,512")
  args = parser.parse_args()
  lengths = [int(x) for x in args.lengths.split(",")]
  tiles = [int(x) for x in args.tiles.split(",")]
  print("skipped tiles (full tiles), per pattern, row length L and square tile size\n")
  print("| pattern | " + " | ".join(f"L={n}, tile {t}" for n in lengths for t in tiles)
        + " |\n|---|" + "---|" * (len(lengths) * len(tiles)))
  for name, spec, kind, docs in PATTERNS:
    cells = []
    for n in lengths:
      meta = row_layout(kind, n, documents=docs)
      for t in tiles:
        table = tile_table(spec, meta, meta, t, t)
        cells.append(f"{100 * skipped_fraction(table):.1f}% ({100 * (table == FULL).mean():.1f}%)")
    print(f"| {name} | " + " | ".join(cells) + " |", flush=True)


if __name__ == "__main__":
  main()
