"""The CARD claims study (benchmarks/studies/card_claims.py): its forked schedule gives each
length exactly its own run, its rate is the trainer's wsd schedule, and its tiny
configuration writes the JSON, table and picture with the crossover read from the curves."""

import json
import sys

import numpy as np
import pytest

from benchmarks.studies import card_claims, card_claims_report as report
from benchmarks.studies.forked_wsd import Model, Rows, Schedule, train_lengths
from cardjax.config import load_config
from cardjax.train.optimizer import learning_rate


def _config(objective="card", seed=0):
  c = load_config("tiny_ar")
  c.objective.name = objective
  c.seed = seed
  c.model.hidden_size, c.model.intermediate_size, c.model.num_layers = 32, 64, 1
  c.data.seq_len, c.data.batch_size = 32, 4
  c.train.warmup_steps = 2
  return c


def _rows(count, seq=32, seed=0):
  rng = np.random.default_rng(seed)
  return {"tokens": rng.integers(4, 512, (count, seq)).astype(np.int32),
          "positions": np.tile(np.arange(seq, dtype=np.int32), (count, 1)),
          "segment_ids": np.ones((count, seq), np.int32),
          "loss_mask": np.ones((count, seq), np.int32)}


def test_schedule_is_the_trainers_wsd():
  c = _config()
  for length in (10, 37):
    c.train.steps, c.train.schedule, c.train.decay_fraction = length, "wsd", 0.2
    trainer = learning_rate(c.train)
    ours = Schedule(c.train.lr, c.train.warmup_steps, 0.2, c.train.min_lr_ratio)
    np.testing.assert_allclose([ours.rate(s, length) for s in range(length)],
                               [float(trainer(s)) for s in range(length)], rtol=1e-6)


def test_a_forked_length_equals_its_own_run():
  """The 6-step run read off the trunk of a 10-step one is the 6-step run trained alone."""
  c = _config()
  schedule = Schedule(c.train.lr, 2, 0.2, c.train.min_lr_ratio)
  rows, val = _rows(12), _rows(4, seed=1)
  batches = [{k: v for k, v in val.items()}]
  both = train_lengths(Model(c), Rows(rows, 4, 0), [6, 10], schedule, batches)
  alone = train_lengths(Model(c), Rows(rows, 4, 0), [6], schedule, batches)
  assert set(both) == {6, 10}
  assert both[6] == pytest.approx(alone[6], rel=1e-6, abs=1e-6)
  assert both[10] != pytest.approx(both[6])  # the longer run went on learning


def test_rows_visit_every_row_once_an_epoch():
  rows = Rows(_rows(12), 4, seed=3)
  seen = np.concatenate([np.asarray(rows.at(s)["tokens"][:, 0]) for s in range(3)])
  assert sorted(seen) == sorted(rows.arrays["tokens"][:, 0])
  other = np.concatenate([np.asarray(rows.at(s)["tokens"][:, 0]) for s in range(3, 6)])
  assert not np.array_equal(seen, other)  # a new order the next epoch


def test_crossover_reads_the_mean_curves():
  epochs = [1, 2, 4, 8]
  ar = [[3.0, 2.5, 2.4, 2.6], [3.0, 2.5, 2.4, 2.8]]
  card = [[3.2, 2.8, 2.45, 2.5], [3.2, 2.8, 2.41, 2.5]]
  assert report.crossover(epochs, ar, card) == 8  # mean 2.43 > 2.4 at 4, 2.5 < 2.7 at 8
  assert report.crossover(epochs, card, ar) == 1
  assert report.crossover(epochs, ar, [[4.0] * 4]) is None
  assert report.mean_curve([[1.0, None], [3.0, None]]) == [2.0, None]


@pytest.mark.integration  # 45 s on 2 cores: the study's tiny run
def test_tiny_study_writes_its_json(tmp_path, monkeypatch):
  out = tmp_path / "claims.json"
  monkeypatch.setattr(sys, "argv", [
      "card_claims", "--workdir", str(tmp_path / "w"), "--json", str(out), "--tokens", "600",
      "--epochs", "1,2", "--seeds", "0", "--hidden", "32", "--layers", "1", "--seq", "32",
      "--batch", "4", "--warmup", "1", "--eval-batches", "1", "--time-rounds", "1"])
  card_claims.main()
  got = json.loads(out.read_text())
  for key in ("corpus", "train_tokens", "epochs", "seeds", "val_nll", "best", "crossover_epoch",
              "step_time", "machine"):
    assert key in got, key
  assert got["epochs"] == [1, 2] and got["seeds"] == [0]
  assert 600 <= got["train_tokens"] < 600 + 32
  assert set(got["val_nll"]) == {"ar", "card", "card_half"}
  assert all(len(c) == 1 and len(c[0]) == 2 for c in got["val_nll"].values())
  assert got["best"]["ar"] == [min(got["val_nll"]["ar"][0])]
  assert got["crossover_epoch"] == report.crossover([1, 2], got["val_nll"]["ar"],
                                                    got["val_nll"]["card"])
  for key in ("card_over_ar", "bd3lm_over_card", "mdlm_over_ar"):
    assert got["step_time"][key] > 0
  assert out.with_suffix(".md").read_text().startswith("Validation NLL")
  assert out.with_suffix(".png").stat().st_size > 0
  cache = json.loads((tmp_path / "w" / "curves.json").read_text())
  assert len(cache) == 3  # a second call resumes from these


def test_bad_arguments_are_named(monkeypatch):
  monkeypatch.setattr(sys, "argv", ["card_claims", "--model-size", "9"])
  with pytest.raises(SystemExit):
    card_claims.main()


@pytest.mark.integration  # 20 s on 2 cores: the study's named runs
def test_tiny_budgets_study_trains_the_named_runs(tmp_path, monkeypatch):
  # One pass at growing budgets: every seed at the smaller budgets, the first at the
  # largest; --runs leaves out the half-clean variant.
  out = tmp_path / "budgets.json"
  monkeypatch.setattr(sys, "argv", [
      "card_claims", "--workdir", str(tmp_path / "w"), "--json", str(out), "--budgets", "2,4",
      "--tokens", "600",
      "--seeds", "0,1", "--runs", "ar,card", "--hidden", "32", "--layers", "1", "--seq", "32",
      "--batch", "4", "--warmup", "1", "--eval-batches", "1", "--time-rounds", "0"])
  card_claims.main()
  got = json.loads(out.read_text())
  assert got["budgets"] == [2, 4] and set(got["val_nll"]) == {"ar", "card"}
  assert [c[1] is None for c in got["val_nll"]["ar"]] == [False, True]
  ar = [got["val_nll"]["ar"][0][0], got["val_nll"]["ar"][1][0]]
  card = [got["val_nll"]["card"][0][0], got["val_nll"]["card"][1][0]]
  assert got["card_over_ar"]["card"][0] == pytest.approx(sum(card) / sum(ar))
  assert len(got["epochs_of_data"]) == 2 and "step_time" not in got


def test_runs_must_name_ar_and_card(monkeypatch):
  monkeypatch.setattr(sys, "argv", ["card_claims", "--runs", "ar,card_half"])
  with pytest.raises(SystemExit):
    card_claims.main()
