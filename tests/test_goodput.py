"""Goodput and where the step time goes: the ledger's arithmetic against hand-computed
figures (a launcher's restart from an older checkpoint that redoes steps, then a new command),
and a run stopped and resumed in this process, with its metrics lines' timing figures."""

import json

import pytest

from cardjax.train import train
from cardjax.train.goodput import Ledger
from train_helpers import prepare_small, small_config


def _steps(ledger, first, last, seconds, end):
  """Steps first..last of `seconds` each, the first ending at unix time `end`."""
  for step in range(first, last + 1):
    ledger.step(step, seconds, end)
    end += seconds
  return end - seconds


def test_ledger_arithmetic_over_a_restart_that_redoes_steps(tmp_path):
  ledger = Ledger(path=tmp_path / "goodput.json")
  # Attempt 0 starts at t=1000: step 1 ends at 1010 (set-up and compile: start-up), steps
  # 2..10 take 1 s each (ending 1011..1019); its record was last written at step 10, then
  # the host was lost (no close).
  ledger.begin(0, 1000.0, attempt=0)
  ledger.step(1, 123.0, 1010.0)  # the first step's own time is start-up, whatever it says
  _steps(ledger, 2, 10, 1.0, 1011.0)
  ledger.save()
  # The launcher restarts it (attempt 1) at t=1030 from checkpoint 6: step 7 (its first)
  # ends at 1035; steps 8, 9, 10 (done before: lost) take 2 s each; 11, 12 take 1.5 s each.
  ledger = Ledger.open(tmp_path)
  ledger.begin(6, 1030.0, attempt=1)
  ledger.step(7, None, 1035.0)
  _steps(ledger, 8, 10, 2.0, 1037.0)
  _steps(ledger, 11, 12, 1.5, 1042.5)
  assert ledger.close(1045.0).startswith("goodput 26.7%: 12.0 s in kept steps of 45.0 s over "
                                         "2 attempt(s)")
  # By hand: wall = (1019 - 1000) + (1045 - 1030) + the restart's gap (1030 - 1019) = 45;
  # productive = 9 x 1 + 2 x 1.5 = 12; start-up = 10 + 5; lost = 3 x 2 = 6 over 4 redone
  # steps (7 to 10; step 7's time is start-up); the rest 45 - 11 - 15 - 12 - 6 = 1.
  totals = Ledger.open(tmp_path).totals()
  assert totals == pytest.approx({"wall_s": 45.0, "restart_s": 11.0, "other_s": 1.0,
                                  "startup_s": 15.0, "productive_s": 12.0, "lost_s": 6.0,
                                  "lost_steps": 4, "attempts": 2, "goodput": 12 / 45})
  saved = json.loads((tmp_path / "goodput.json").read_text())["attempts"]
  assert [(a["attempt"], a["resumed_from"], a["last_step"]) for a in saved] == [
      (0, 0, 10), (1, 6, 12)]
  # A new command a day later (CARDJAX_ATTEMPT unset): the day between is not the run's;
  # at t=90000 it resumes from 12, step 13 is start-up (4 s), 14 and 15 take 1 s each.
  ledger = Ledger.open(tmp_path)
  ledger.begin(12, 90000.0, attempt=None)
  ledger.step(13, None, 90004.0)
  _steps(ledger, 14, 15, 1.0, 90005.0)
  assert ledger.totals(now=90006.0) == pytest.approx({
      "wall_s": 51.0, "restart_s": 11.0, "other_s": 1.0, "startup_s": 19.0,
      "productive_s": 14.0, "lost_s": 6.0, "lost_steps": 4, "attempts": 3,
      "goodput": 14 / 51})


def test_an_unreadable_ledger_starts_again(tmp_path, caplog):
  (tmp_path / "goodput.json").write_text('{"attempts": [')
  ledger = Ledger.open(tmp_path)
  assert ledger.attempts == [] and "unreadable" in caplog.text


@pytest.fixture(scope="module")
def data_dir(tmp_path_factory):
  return prepare_small(tmp_path_factory.mktemp("data"))


def _lines(workdir):
  return [json.loads(l) for l in open(workdir / "metrics.jsonl") if "train/loss" in l]


def test_stop_and_resume_continue_the_ledger(data_dir, tmp_path, monkeypatch, capsys):
  """6 steps, then (checkpoint 6 lost, as if killed before its save) a launcher's restart to
  step 8 from checkpoint 4: steps 5 and 6 are redone, 7 and 8 are new."""
  run = tmp_path / "run"
  config = ["--config.train.checkpoint_every=2", "--config.train.log_every=2",
            "--config.train.eval_every=0"]
  train(small_config(data_dir, *config, "--config.train.steps=6"), run)
  first = json.loads((run / "goodput.json").read_text())["attempts"]
  assert [(a["resumed_from"], a["last_step"], a["lost_steps"]) for a in first] == [(0, 6, 0)]
  assert first[0]["productive_s"] > 0 and first[0]["startup_s"] > 0
  lines = _lines(run)
  assert [l["step"] for l in lines] == [2, 4, 6]
  for line in lines:
    # Where each line's steps went: the three parts add up to the step time.
    parts = line["train/data_wait_s"] + line["train/device_wait_s"] + line["train/host_s"]
    assert parts == pytest.approx(line["train/step_s"], rel=1e-6)
    assert min(line["train/data_wait_s"], line["train/device_wait_s"]) >= 0
    assert 0 <= line["train/goodput"] < 1
    tokens_per_step = 8 * 32  # data.batch_size x data.seq_len, AR reads them once
    assert line["train/tokens_per_s"] * line["train/step_s"] == pytest.approx(tokens_per_step)
  assert "goodput" in capsys.readouterr().out

  import shutil
  shutil.rmtree(run / "checkpoints" / "6")
  monkeypatch.setenv("CARDJAX_ATTEMPT", "1")
  train(small_config(data_dir, *config, "--config.train.steps=8"), run)
  ledger = Ledger.open(run)
  a0, a1 = ledger.attempts
  assert a0 == first[0]  # the first attempt's record is carried over as it was
  assert (a1["attempt"], a1["resumed_from"], a1["last_step"], a1["lost_steps"]) == (1, 4, 8, 2)
  assert a1["lost_s"] > 0 and a1["productive_s"] > 0  # step 6 lost, steps 7 and 8 kept
  totals = ledger.totals()
  assert totals["restart_s"] == pytest.approx(a1["start"] - a0["end"])
  assert totals["goodput"] == pytest.approx(
      (a0["productive_s"] + a1["productive_s"]) / totals["wall_s"])
  out = capsys.readouterr().out
  assert f"goodput {totals['goodput']:.1%}" in out and "over 2 attempt(s)" in out
  assert "(2 steps)" in out
  # The resumed run's last line reports the ledger's goodput as it stood then.
  last = _lines(run)[-1]
  assert last["step"] == 8 and 0 < last["train/goodput"] <= totals["goodput"] + 0.05
