"""`make demo` at its default budget shows the claim: a real exact match on arithmetic, and
MARS at tau 0.95 writing 2 or more tokens a forward within 3 points of AR (minutes of
training: `make test-slow`)."""

import pytest

from cardjax.demo import run_demo


@pytest.mark.slow
def test_the_full_demo_shows_the_claim(tmp_path):
  rows = run_demo(tmp_path / "demo")["decoding"]
  ar = next(r for r in rows if r["task"] == "arith" and r["model"] == "sft")
  mars = next(r for r in rows if r["method"] == "mars" and r["setting"] == "tau=0.95 window")
  assert ar["exact_match"] >= 0.6 and ar["tokens_per_forward"] == 1.0
  assert mars["tokens_per_forward"] >= 2.0
  assert mars["exact_match"] >= ar["exact_match"] - 0.03
  code = [r for r in rows if r["task"] == "code"]
  assert len({round(r["judge_nll"], 4) for r in code}) > len(code) // 2  # real, varied text
