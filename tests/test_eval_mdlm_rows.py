"""The code table's MDLM rows (eval/suite.code_rows): the DUS paper's comparison, each
planner at the forwards it should take."""

from __future__ import annotations

import math

import pytest

from cardjax.decoding.methods import Options
from cardjax.eval import suite
from serve_helpers import mars_run, save_run


def test_settings_pair_dus_with_topk_at_the_same_forwards_and_spacing_both_ways():
  got = suite.mdlm_settings(Options(block=8, shift=True))
  by_name = {(method, setting): opt for setting, method, opt in got}
  for b in (8, 32):
    dus, topk = by_name["dus", f"B={b}"], by_name["dus", f"topk, DUS forwards, B={b}"]
    assert dus.block == topk.block == b and topk.planner == "topk" and not dus.planner
  for method, setting in (("eb", "gamma=16.0{} B=8"), ("cb", "tau=0.7{} B=8")):
    assert not by_name[method, setting.format("")].spacing
    spaced = by_name[method, setting.format(" spacing g0=2")]
    assert spaced.spacing and spaced.g0 == 2  # B / 4: the DUS code's 8 for blocks of 32
  assert by_name["cb", "tau=1 (one token a forward) B=8"].tau == 1.0
  assert all(opt.shift for opt in by_name.values())  # the model's output convention kept


@pytest.fixture(scope="module")
def runs(tmp_path_factory):
  """An AR judge and a random-init MDLM run (shifted outputs) on the same tokenizer."""
  root = tmp_path_factory.mktemp("mdlm_rows")
  mars_run(root)  # the tokenizer in root/tok and a model to judge with
  judge = suite.load_run(save_run(suite.load_run(root / "run").model, root / "ar",
                                  root / "tok", "ar"))
  mdlm = suite.load_run(save_run(judge.model, root / "mdlm", root / "tok", "mdlm",
                                 shift=True))
  return judge, mdlm


def test_code_rows_decode_every_mdlm_setting_at_its_forwards(runs):
  judge, mdlm = runs
  tok = judge.tokenizer
  prompts = [tok.encode("alpha beta gamma")[:4], tok.encode("one two three")[:4]]
  rows = suite.code_rows(judge, {}, {"mdlm": mdlm}, {"prompts": prompts}, batches=(2,),
                         taus=(), block=4, max_new_tokens=16, log=lambda line: None)
  mdlm_rows = {(r["method"], r["setting"]): r for r in rows if r["model"] == "mdlm"}
  assert len(mdlm_rows) == len(suite.mdlm_settings(Options(block=4)))
  # DUS at B: log2(B) forwards a block; topk at DUS forwards takes exactly as many.
  for b in (4, 16):
    dus, topk = mdlm_rows["dus", f"B={b}"], mdlm_rows["dus", f"topk, DUS forwards, B={b}"]
    want = b / math.ceil(math.log2(b))
    assert dus["tokens_per_forward"] == pytest.approx(want)
    assert topk["tokens_per_forward"] == pytest.approx(want)
  one = mdlm_rows["cb", "tau=1 (one token a forward) B=4"]
  assert one["tokens_per_forward"] == pytest.approx(1.0, abs=0.1)
  assert all(math.isfinite(r["judge_nll"]) for r in mdlm_rows.values())


def test_the_spacing_gap_reaches_the_decoder(runs):
  from cardjax.decoding.methods import make_decoder

  _, mdlm = runs
  decode = make_decoder("eb", mdlm.frozen, "mdlm", Options(block=8, spacing=True, g0=2))
  assert decode.keywords["g0"] == 2 and decode.keywords["spacing"]


def test_generate_flag_g0_sets_the_spacing_gap():
  import argparse

  from cardjax.decoding import cli

  parser = argparse.ArgumentParser()
  cli.add_decoding_arguments(parser)
  args = parser.parse_args(["--method", "eb", "--spacing", "--g0", "2"])
  opt = cli.options_from_args(args, stop_ids=(), pad_id=0, block=8)
  assert opt.spacing and opt.g0 == 2
  assert cli.options_from_args(parser.parse_args([]), (), 0, 8).g0 == 8  # the DUS code's
