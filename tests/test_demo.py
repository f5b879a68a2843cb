"""`make demo` end to end (what a new user runs first)."""

from cardjax.demo import run_demo


def test_demo_runs_and_reports(tmp_path):
  report = run_demo(tmp_path / "demo")
  assert report["python_stdlib_splits"]["train"] > 1000
  assert report["arith_sft_splits"] == {"train": 20000, "test": 500}
  assert report["orbax_max_abs_diff"] == 0.0 and report["hf_roundtrip_max_abs_diff"] == 0.0
  assert report["transformers_max_abs_diff"] < 1e-4
  assert report["data_resume_exact"] is True
  assert 5.5 < report["init_nll_python_stdlib"] < 7.0  # near log(512) = 6.24 when untrained
  assert (tmp_path / "demo" / "report.json").is_file()
  runs = report["training"]
  assert set(runs) == {"ar", "card", "sft", "mars"}
  for name, run in runs.items():
    assert run["last_loss"] < run["first_loss"], name
  assert runs["mars"]["eval_ar_nll"] < runs["ar"]["eval_ar_nll"]  # arith is easier than code
  assert (tmp_path / "demo" / "hf" / "tokenizer.json").is_file()
  rows = report["decoding"]
  assert {r["method"] for r in rows} >= {"ar", "mars", "mars --verify", "card", "dus", "eb",
                                          "cb"}
  checks = [r["equals_ar"] for r in rows if "equals_ar" in r]
  assert len(checks) == 5 and all(checks)  # MARS tau = 1 (window, 2B window, cache), --verify,
  # CARD AR order
  assert all(r["tokens_per_forward"] > 0 and r["tokens_per_second"] > 0 for r in rows)
  assert (tmp_path / "demo" / "decode.md").is_file()
