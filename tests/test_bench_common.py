"""benchmarks/common.py: the one "centre [range]" cell keeps each table's former format."""

import statistics

import pytest

from benchmarks import common


def test_mean_cell_as_the_seed_tables_print_it():
  # code_spread's judge NLL and real_model's tokens/forward: mean [min-max], 2 decimals.
  assert common.spread([1.0, 2.0, 4.5]) == "2.50 [1.00-4.50]"
  # real_model's exact match: a percent after the mean only.
  assert common.spread([80.0, 90.0], 1, "%") == "85.0% [80.0-90.0]"


def test_median_cell_as_paired_timing_prints_it():
  assert common.spread([1.1, 1.4, 1.25], 2, "x", statistics.median) == "1.25x [1.10-1.40]"


def test_range_cell_of_a_precomputed_range():
  assert common.range_cell(12.34, 10.0, 15.06, 1) == "12.3 [10.0-15.1]"


def test_seed_runs_sit_where_bench_pack_looks(tmp_path):
  assert common.run_dir(tmp_path, "sft", 0) == tmp_path / "runs" / "sft"
  assert common.run_dir(tmp_path, "sft", 2) == tmp_path / "runs" / "seed2" / "sft"


@pytest.mark.parametrize("start", [None, "header\n"])
def test_tee_prints_and_keeps_lines(tmp_path, capsys, start):
  path = tmp_path / "out" / "rows.md"
  if start is None:
    path.parent.mkdir()
    path.write_text("before\n")
  tee = common.Tee(path, start)
  tee("| a |")
  assert capsys.readouterr().out == "| a |\n"
  assert path.read_text() == ("before\n" if start is None else start) + "| a |\n"
