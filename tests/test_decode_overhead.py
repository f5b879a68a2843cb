"""benchmarks/decode_overhead.py at toy sizes: the JSON it writes and the widths it counts."""

import json
import math

from benchmarks import decode_overhead

KEYS = {"method", "setting", "batch", "width", "decoder_ms_per_forward", "bare_ms_per_forward",
        "overhead_ratio", "call_fixed_ms"}


def test_quick_run_writes_a_row_per_setting(tmp_path, capsys):
  out = tmp_path / "overhead.json"
  # 3 repeats, not --quick's 1: a single timing on a busy machine can invert the lengths.
  decode_overhead.main(["--quick", "--toy", "--repeats", "3", "--settings", "ar,mars-fit",
                        "--json", str(out)])
  report = json.loads(out.read_text())
  assert {"cpu", "device", "jax"} <= set(report["machine"])
  rows = report["rows"]
  assert [(r["method"], r["batch"]) for r in rows] == [("ar", 1), ("mars", 1)]
  for r in rows:
    assert KEYS <= set(r)
    for k in KEYS - {"method", "setting", "batch", "call_fixed_ms"}:
      assert math.isfinite(r[k]) and r[k] > 0, (r["method"], k, r[k])
    # A difference of two noisy timings: finite, though it may dip below 0 on a busy box.
    assert math.isfinite(r["call_fixed_ms"])
  ar, mars = rows
  assert ar["width"] == 1 and ar["forwards"] == list(decode_overhead.QUICK_LENGTHS)
  # The fit window reads n + B, n a compiled pending width: 1, 2 or 4 for B = 4.
  assert 1 + decode_overhead.MARS_B <= mars["width"] <= 2 * decode_overhead.MARS_B
  counted = mars["widths"][str(decode_overhead.QUICK_LENGTHS[1])]
  assert set(counted) <= {"5", "6", "8"} and sum(counted.values()) == mars["forwards"][1]
  table = capsys.readouterr().out
  assert "| ar | kv cache | 1 |" in table and "| mars | window fit" in table
