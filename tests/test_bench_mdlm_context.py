"""benchmarks/studies/mdlm_context.py: the masked CE by mask rate against a plain numpy
rendering."""

from __future__ import annotations

import math
from types import SimpleNamespace

import ml_collections
import numpy as np
import pytest

import objectives_reference as ref
from objectives_helpers import MASK, forward, make_batch, np_batch, small_model
from benchmarks.studies import mdlm_context as ctx
from cardjax.attention import BIDIRECTIONAL

ROWS = [[(0, 16)], [(4, 12)], [(0, 6), (0, 10)], [(0, 1), (0, 9)]]


def test_unigram_entropy_counts_scored_tokens_only():
  batch = {"tokens": np.array([[1, 1, 2, 3, 9, 9]]),
           "loss_mask": np.array([[1, 1, 1, 1, 0, 1]]),
           "segment_ids": np.array([[1, 1, 1, 1, 1, 0]])}
  want = -(0.5 * math.log(0.5) + 2 * 0.25 * math.log(0.25))  # 1, 1, 2, 3
  assert ctx.unigram_entropy([batch]) == pytest.approx(want)


@pytest.mark.parametrize("shift", [False, True])
def test_masked_ce_equals_numpy(shift):
  model = small_model()
  config = ml_collections.ConfigDict({"objective": {"shift": shift},
                                      "model": {"mask_token_id": MASK}})
  loaded = SimpleNamespace(config=config, model=model)
  batches = [np_batch(make_batch(ROWS, 16, seed=s)) for s in (0, 1)]
  rates = (0.3, 1.0)
  got = ctx.masked_ce_by_rate(loaded, batches, rates, seed=5)
  for t in rates:
    rng = np.random.default_rng([5, int(t * 1000)])
    total = count = 0.0
    for b in batches:
      eligible = ref.maskable(b["segment_ids"], b["loss_mask"], shift)
      masked = eligible & (rng.random(eligible.shape) < t)
      if t == 1.0:
        assert (masked == eligible).all()
      logits = forward(model, np.where(masked, MASK, b["tokens"]), b["positions"],
                       b["segment_ids"], np.zeros_like(b["tokens"]), BIDIRECTIONAL)
      logp = logits - np.log(np.exp(logits - logits.max(-1, keepdims=True)).sum(-1,
                             keepdims=True)) - logits.max(-1, keepdims=True)
      for r, q in zip(*np.nonzero(masked)):
        at = q - 1 if shift else q  # shift: the output one before predicts the token
        total -= logp[r, at, b["tokens"][r, q]]
        count += 1
    assert got[t] == pytest.approx(total / count, rel=1e-5)


def test_midpoint_rule_rates():
  assert ctx.midpoints(4) == (0.125, 0.375, 0.625, 0.875)
  assert ctx.elbo({0.25: 2.0, 0.75: 4.0}) == 3.0


@pytest.mark.integration  # 45 s on 2 cores: trains and probes a run
def test_every_step_probes_each_kept_checkpoint(tmp_path, monkeypatch):
  """--every-step: one row per kept checkpoint, oldest first, each from that step's weights
  (the CE by t over training); the ELBO column and an AR run's NLL on the same batches."""
  import json
  import sys

  from cardjax.config import load_config
  from cardjax.data.prepare import prepare
  from cardjax.train import train

  config = load_config("configs/tiny_mdlm.py", [
      f"--config.data.data_dir={tmp_path / 'data'}", "--config.data.options.max_files=40",
      "--config.data.options.validation_percent=10", "--config.data.seq_len=32",
      "--config.train.steps=6", "--config.train.checkpoint_every=3",
      "--config.train.eval_every=0", "--config.train.progress=false",
      "--config.train.lr=5e-2"])
  prepare(config)
  train(config, tmp_path / "run")
  ar = config.copy_and_resolve_references()
  ar.objective.name, ar.train.steps = "ar", 2
  train(ar, tmp_path / "ar")
  out = tmp_path / "rows.json"
  monkeypatch.setattr(sys, "argv", ["mdlm_context", str(tmp_path / "run"), "--batches", "1",
                                    "--every-step", "--elbo-points", "2", "--ar",
                                    str(tmp_path / "ar"), "--json", str(out)])
  ctx.main()
  data = json.loads(out.read_text())
  rows = data["rows"]
  assert math.isfinite(data["ar_nll"]) and data["ar_nll"] > 0
  for r in rows:
    assert r["elbo_over_ar_nll"] == pytest.approx(r["elbo"] / data["ar_nll"])
  assert [r["step"] for r in rows] == [3, 6]
  assert rows[0]["masked_ce"] != rows[1]["masked_ce"]  # two sets of weights
  assert all(set(r["masked_ce"]) == {str(t) for t in ctx.RATES} for r in rows)
  from cardjax.eval import nll
  from cardjax.restore import load_run

  loaded = load_run(tmp_path / "run")  # the latest step: the ELBO is the midpoints' mean
  batches = nll.validation_batches(nll.data_config(loaded), "validation", 1)
  want = ctx.masked_ce_by_rate(loaded, batches, (0.25, 0.75), seed=1)
  assert rows[-1]["elbo"] == pytest.approx(sum(want.values()) / 2, rel=1e-6)
