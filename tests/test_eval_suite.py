"""The benchmark table's seed merge: quality as mean and range over seeds, speed from the
first seed's timed rows."""

import pytest

from cardjax.eval import suite


def row(batch, em, setting="kv cache", method="ar", tps=100.0, **extra):
  return {"task": "arith", "model": "mars", "method": method, "setting": setting,
          "batch": batch, "tokens": 10, "forwards": 5, "tokens_per_forward": 2.0,
          "tokens_per_second": tps, "tokens_per_second_range": [90.0, 110.0], "speedup": 1.0,
          "exact_match": em, **extra}


def test_merge_seeds_means_quality_and_keeps_the_first_seeds_timing():
  by_seed = {0: [row(1, 0.8), row(4, 0.8), row(1, 0.8, "tau=1.0", "mars", equals_ar=True)],
             1: [row(4, 0.6), row(4, 0.6, "tau=1.0", "mars", tps=1.0, equals_ar=True)],
             2: [row(4, 0.7), row(4, 0.7, "tau=1.0", "mars", equals_ar=False)]}
  merged = suite.merge_seeds(by_seed)
  assert [r["batch"] for r in merged] == [1, 4, 1]
  assert merged[0]["exact_match"] == pytest.approx(0.7)
  assert merged[0]["exact_match_seeds"] == [0.8, 0.6, 0.7]
  assert merged[2]["tokens_per_second"] == 100.0  # seed 0's timing, never another seed's
  assert merged[2]["equals_ar"] is False  # one seed broke the invariant: the row says so
  line = suite.format_row(merged[0])
  assert "EM 70.0% [60.0%-80.0%, 3 seeds]" in line and "100 [90-110]" in line


def test_merge_seeds_names_a_missing_row():
  with pytest.raises(ValueError, match="seed 1 has no row"):
    suite.merge_seeds({0: [row(1, 0.5)], 1: [row(1, 0.5, method="mars --verify")]})


def test_format_row_of_one_seed_has_no_range():
  line = suite.format_row(row(1, 0.5))
  assert "EM 50.0% |" in line
