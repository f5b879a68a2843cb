"""benchmarks/decode_overhead.py at toy sizes: the JSON it writes and the widths it counts."""

import json
import math

import pytest

from benchmarks import decode_overhead

KEYS = {"method", "setting", "batch", "width", "decoder_ms_per_forward", "bare_ms_per_forward",
        "overhead_ratio", "call_fixed_ms", "bare_still_ms_per_forward", "overhead_ratio_still"}


@pytest.mark.integration  # 45 s on 2 cores: the benchmark's quick run
def test_quick_run_writes_a_row_per_setting(tmp_path, capsys):
  out = tmp_path / "overhead.json"
  # 3 repeats, not --quick's 1: a single timing on a busy machine can invert the lengths.
  decode_overhead.main(["--quick", "--toy", "--repeats", "3", "--settings", "ar,mars-fit",
                        "--json", str(out)])
  report = json.loads(out.read_text())
  assert {"cpu", "device", "jax"} <= set(report["machine"])
  rows = report["rows"]
  assert [(r["method"], r["batch"]) for r in rows] == [("ar", 1), ("mars", 1)]
  # Differences of two noisy timings: finite, though at toy sizes on a busy box they may
  # dip below 0 (the still-position yardstick did once in a make test run).
  noisy = {"call_fixed_ms", "bare_still_ms_per_forward", "overhead_ratio_still"}
  for r in rows:
    assert KEYS <= set(r)
    for k in KEYS - {"method", "setting", "batch"} - noisy:
      assert math.isfinite(r[k]) and r[k] > 0, (r["method"], k, r[k])
    assert all(math.isfinite(r[k]) for k in noisy)
  ar, mars = rows
  assert ar["width"] == 1 and ar["forwards"] == list(decode_overhead.QUICK_LENGTHS)
  # The fit window reads n + B, n a compiled pending width: 1, 2 or 4 for B = 4.
  assert 1 + decode_overhead.MARS_B <= mars["width"] <= 2 * decode_overhead.MARS_B
  counted = mars["widths"][str(decode_overhead.QUICK_LENGTHS[1])]
  assert set(counted) <= {"5", "6", "8"} and sum(counted.values()) == mars["forwards"][1]
  table = capsys.readouterr().out
  assert "| ar | kv cache | 1 |" in table and "| mars | window fit" in table


def test_a_moving_bare_loop_reads_other_positions_and_says_when_the_cache_is_short():
  import dataclasses

  import pytest
  from flax import nnx

  from benchmarks.decode_forward import CONFIG
  from cardjax.eval.forward_cost import MOVES, forward_loop
  from cardjax.model import create_model

  cfg = dataclasses.replace(CONFIG, hidden_size=32, intermediate_size=64, num_layers=1,
                            num_heads=2, num_kv_heads=1)
  graphdef, state = nnx.split(create_model(cfg, seed=0))
  # 4 forwards start at 8, 9, 10, 11: other rotary angles, so other logits than 4 at 8.
  still = float(forward_loop(graphdef, state, 1, 2, 16, 8, MOVES)())
  moving = float(forward_loop(graphdef, state, 1, 2, 16, 8, MOVES, moving=True)())
  assert math.isfinite(moving) and moving != still
  with pytest.raises(ValueError, match="12 cache slots cannot hold 8 cached"):
    forward_loop(graphdef, state, 1, 2, 12, 8, MOVES, moving=True)
