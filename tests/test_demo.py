"""`make demo` end to end (what a new user runs first)."""

import pytest

from cardjax.demo import run_demo


@pytest.mark.integration  # about 2 minutes on 2 cores: `make test-integration`
def test_demo_runs_and_reports(tmp_path, capsys):
  """The quick budget (every stage, a few steps per model); the full one trains the same
  recipes longer (test_demo_full.py, marked slow)."""
  report = run_demo(tmp_path / "demo", budget="quick")
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
  assert len(checks) == 4 and all(checks)  # MARS tau = 1 (window, block cache), --verify,
  # CARD AR order
  assert all(r["tokens_per_forward"] > 0 and r["tokens_per_second"] > 0 and "speedup" in r
             for r in rows)
  assert all(("exact_match" in r) != ("judge_nll" in r) for r in rows)
  # A row counts its forwards while it generates: AR writes one token each, at batch 16.
  assert all(r["tokens_per_forward"] == 1.0 and r["batch"] == 16 for r in rows
             if r["method"] == "ar")
  assert (tmp_path / "demo" / "decode.md").is_file()
  out = capsys.readouterr().out
  assert "one forward on this CPU: 1 token" in out and "MARS at tau 0.95 wrote" in out
  assert "NVIDIA H200 (2026-12-04" in out  # the recorded accelerator figure, dated
  for picture in ("training.png", "decoding.png"):
    assert (tmp_path / "demo" / picture).stat().st_size > 10_000
    assert f"picture: {tmp_path / 'demo' / picture}" in out


def test_the_kept_instruct_model_is_used_only_with_the_demos_tokenizer(tmp_path, capsys):
  """The full demo loads the kept instruct model only when its tokenizer is the one the demo
  built (other ids would mean other text) and says why whenever it trains its own."""
  from cardjax.demo import INSTRUCT, instruct_model

  built = tmp_path / "tokenizer"
  built.mkdir()
  (built / "tokenizer.json").write_bytes(
      (INSTRUCT / "checkpoints" / "hf_assets" / "tokenizer.json").read_bytes())
  assert instruct_model(built) == INSTRUCT
  assert instruct_model(built, tmp_path / "missing") is None
  assert "not in this install" in capsys.readouterr().out
  (built / "tokenizer.json").write_text("{}")
  assert instruct_model(built) is None
  assert "another arith_sft tokenizer" in capsys.readouterr().out
