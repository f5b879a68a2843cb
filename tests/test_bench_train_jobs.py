"""benchmarks/decode.py --train-jobs: the runs are dealt to jobs so their steps come out even."""

import pytest

from benchmarks import decode


def test_units_keep_mars_with_its_sft():
  units = decode.training_units(["sft", "mars", "ar", "card"], [0, 1])
  assert units == [(0, ["sft", "mars"]), (0, ["ar"]), (0, ["card"]),
                   (1, ["sft", "mars"]), (1, ["ar"]), (1, ["card"])]
  assert decode.training_units(["ar", "mdlm"], [2]) == [(2, ["ar"]), (2, ["mdlm"])]


def test_units_keep_the_a2d_mdlm_with_its_ar():
  units = decode.training_units(["ar", "mdlm", "mdlm_a2d"], [0])
  assert units == [(0, ["ar", "mdlm_a2d"]), (0, ["mdlm"])]


def test_shares_even_out_the_steps():
  # 3 seeds of ar, card, card_half (2400 steps) and mdlm (2000): 9 equal runs and 3 smaller.
  cost = {"ar": 2400, "card": 2400, "card_half": 2400, "mdlm": 2000}
  units = decode.training_units(["ar", "card", "card_half", "mdlm"], [0, 1, 2])
  shares = decode.share_units(units, lambda u: sum(cost[n] for n in u[1]), 2)
  loads = [sum(cost[n] for _, names in share for n in names) for share in shares]
  assert sorted(loads) == [13600, 14000]  # by seed (round robin) it would be 18400 and 9200
  assert sorted(u for share in shares for u in share) == sorted(units)


def test_fewer_units_than_jobs():
  shares = decode.share_units([(0, ["ar"])], lambda u: 1, 2)
  assert shares == [[(0, ["ar"])]]


def test_unit_spec_round_trip():
  assert decode.parse_units("0:sft+mars,2:card_half") == [(0, ["sft", "mars"]),
                                                          (2, ["card_half"])]
  with pytest.raises(SystemExit, match="items look like"):
    decode.parse_units("0:cards")
