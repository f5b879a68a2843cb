"""benchmarks/recorded.py, bench-check's comparison: a new run against a recorded one, within
the recorded spread."""

import copy

from benchmarks import recorded

AMD = {"cpu": "AMD EPYC 7B13"}


def row(method, setting, em_seeds, tpf, tps, tps_range, speedup):
  return {"task": "arith", "model": "mars", "method": method, "setting": setting, "batch": 1,
          "tokens_per_forward": tpf, "tokens_per_second": tps,
          "tokens_per_second_range": tps_range, "speedup": speedup,
          "exact_match": sum(em_seeds) / len(em_seeds), "exact_match_seeds": em_seeds}


def results(machine=AMD, em=(0.8, 0.9, 0.85), tpf=2.5, speedup=1.2, tps=120.0):
  ar = row("ar", "kv cache", [0.8, 0.9, 0.85], 1.0, 100.0, [95.0, 105.0], 1.0)
  mars = row("mars", "tau=0.95 window", list(em), tpf, tps, [tps * 0.95, tps * 1.05], speedup)
  return {"machine": machine, "rows": [ar, mars]}


def failed(verdicts):
  return {(v.key[2], v.what) for v in verdicts if not v.ok}


def test_a_run_inside_the_recorded_spread_passes():
  verdicts = recorded.compare(results(), results(em=(0.82, 0.88, 0.86), tpf=2.6, speedup=1.25))
  assert failed(verdicts) == set()
  assert "inside the recorded spread" in recorded.report(verdicts)


def test_quality_outside_the_seed_range_fails():
  assert failed(recorded.compare(results(), results(em=(0.3, 0.3, 0.3)))) == {
      ("mars", "quality")}


def test_tokens_per_forward_and_speedup_out_of_range_fail_on_the_same_cpu():
  got = failed(recorded.compare(results(), results(tpf=1.5, speedup=2.0)))
  assert got == {("mars", "tokens/forward"), ("mars", "speedup")}


def test_speedup_on_another_processor_is_reported_not_judged():
  verdicts = recorded.compare(results(), results(machine={"cpu": "Intel Xeon"}, speedup=2.0))
  assert failed(verdicts) == set()
  assert any("another processor" in v.detail for v in verdicts)


def test_a_missing_row_fails():
  new = results()
  new["rows"] = new["rows"][:1]
  assert failed(recorded.compare(results(), copy.deepcopy(new))) == {("mars", "missing")}


def test_a_paired_speedup_is_judged_by_its_per_round_range():
  """A row timed in rounds with AR carries speedup_range (the rounds' ratios), which the
  check uses instead of the ratio of the two rows' timing ranges."""
  rec = results(speedup=1.2)
  rec["rows"][1]["speedup_range"] = [1.1, 1.3]
  assert failed(recorded.compare(rec, results(speedup=1.4))) == set()  # 1.3 x 1.1 = 1.43
  assert failed(recorded.compare(rec, results(speedup=0.95))) == {("mars", "speedup")}
