"""Does a masked-diffusion (MDLM) checkpoint use its context? Masked CE by mask rate.

  python -m benchmarks.studies.mdlm_context RUN [RUN ...] [--data-dir DIR] [--batches 8]
      [--every-step] [--ar AR_RUN] [--elbo-points 10]

For each run (a `cardjax train` folder of an mdlm model) and each fixed mask rate t, masks
every maskable token of the first --batches validation batches with probability t (the same
draw for every run), reads the rows under the model's bidirectional mask and prints the mean
cross-entropy of the masked tokens. Beside it: the unigram entropy of the same tokens, what
a model that ignores its context can reach at best.

A model that reads its context predicts a token far better when 95% of the row is visible
(t = 0.05) than when none is (t = 1); a model whose CE is flat in t and sits at the unigram
entropy has learned token frequencies only, and text decoded from it (DUS, EB, ...) is close
to a unigram draw, whatever the decoder. The trainer's eval loss (the ELBO, an average over
t) cannot tell these two apart as directly. --every-step probes every checkpoint a run kept,
oldest first: the CE by t over training.

ELBO: the negative ELBO per token of the linear-schedule MDLM, E_t[(1/t) sum of masked CE]
per token, equals the integral of the masked CE over t in [0, 1] (a token is masked with
probability t, which cancels the 1/t): estimated here by the midpoint rule on --elbo-points
rates, the same draws for every run, with far less noise than the trainer's validation loss
(one random t per row). --ar RUN scores an AR run's held-out NLL on the very same batches,
and the ELBO / AR NLL ratio is printed beside it.
"""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path

import numpy as np

from benchmarks.common import arg_parser

RATES = (0.05, 0.15, 0.3, 0.5, 0.7, 0.9, 1.0)


def unigram_entropy(batches) -> float:
  """Entropy (nats) of the empirical token distribution of the batches' scored tokens."""
  ids = np.concatenate([b["tokens"][(b["loss_mask"] > 0) & (b["segment_ids"] > 0)]
                        for b in batches])
  p = np.bincount(ids) / ids.size
  p = p[p > 0]
  return float(-(p * np.log(p)).sum())


def masked_ce_by_rate(loaded, batches, rates=RATES, seed: int = 0) -> dict[float, float]:
  """{t: mean CE of the masked tokens} with every maskable token masked with probability t."""
  import jax
  import jax.numpy as jnp

  from cardjax.attention import BIDIRECTIONAL
  from cardjax.objectives.base import token_ce
  from cardjax.objectives.mdlm import diffusion_targets, maskable

  cfg = loaded.config
  shift, mask_id, model = bool(cfg.objective.shift), int(cfg.model.mask_token_id), loaded.model

  @jax.jit
  def sums(tokens, positions, segment_ids, masked):
    targets, weights = diffusion_targets(tokens, masked, jnp.ones(masked.shape), shift)
    logits = model(jnp.where(masked, mask_id, tokens), positions=positions,
                   segment_ids=segment_ids, mask=BIDIRECTIONAL)
    return jnp.sum(token_ce(logits, targets) * weights), jnp.sum(weights)

  out = {}
  for t in rates:
    rng = np.random.default_rng([seed, int(t * 1000)])
    total = count = 0.0
    for b in batches:
      eligible = np.asarray(maskable(b["segment_ids"], b["loss_mask"], shift))
      masked = eligible & (rng.random(eligible.shape) < t)
      s, n = sums(b["tokens"], b["positions"], b["segment_ids"], masked)
      total, count = total + float(s), count + float(n)
    out[t] = total / max(count, 1.0)
  return out


def midpoints(points: int) -> tuple[float, ...]:
  """The midpoint rule's rates on [0, 1]: (k + 1/2) / points."""
  return tuple((k + 0.5) / points for k in range(points))


def elbo(ce_by_rate: dict[float, float]) -> float:
  """The negative ELBO per token: the mean of the masked CE over midpoint rates."""
  return float(np.mean(list(ce_by_rate.values())))


def ar_nll(ar_path: str, mdlm_config, split: str, batches: int) -> float:
  """The AR run's held-out NLL (the trainer's eval step) on the batches the probe reads:
  the MDLM run's data section, the AR run's objective and weights."""
  import copy

  from cardjax.eval import nll
  from cardjax.restore import load_run

  ar = load_run(ar_path)
  if ar.objective not in ("ar", "sft"):
    raise SystemExit(f"--ar {ar_path} is a {ar.objective} run; give an ar run")
  config = copy.deepcopy(mdlm_config)
  config.objective = ar.config.objective
  return float(nll.evaluate_nll(ar, config, split, batches, progress=False)["ar_nll"])


def _models(loaded, every_step: bool):
  """(step, model) of the latest checkpoint, or of every kept one, oldest first."""
  if not every_step:
    yield loaded.step, loaded.model
    return
  from cardjax import checkpoint

  for step in checkpoint.saved_steps(loaded.root):
    yield step, (loaded.model if step == loaded.step
                 else checkpoint.restore_model(loaded.root, step=step)[0])


def main() -> None:
  parser = arg_parser(__spec__, __doc__)
  parser.add_argument("runs", nargs="+", help="mdlm run folders")
  parser.add_argument("--data-dir", default="", help="where the runs' dataset is built "
                      "(default: the first run's data.data_dir; every run reads its batches)")
  parser.add_argument("--batches", type=int, default=8, help="validation batches")
  parser.add_argument("--every-step", action="store_true",
                      help="probe every kept checkpoint of each run, not only the latest")
  parser.add_argument("--elbo-points", type=int, default=10,
                      help="rates of the midpoint rule for the ELBO column (0: none)")
  parser.add_argument("--ar", default="", help="an AR run scored on the same batches: its "
                      "held-out NLL and each ELBO's ratio to it")
  parser.add_argument("--json", default="", help="also write the rows here")
  args = parser.parse_args()

  from cardjax.eval import nll
  from cardjax.restore import load_run

  from benchmarks.common import announce

  info = announce()
  if args.ar and not args.elbo_points:
    raise SystemExit("--ar compares the ELBO with the AR NLL: give --elbo-points >= 1")
  rows, batches, reference = [], None, None
  extra = (["ELBO"] if args.elbo_points else []) + (["ELBO / AR NLL"] if args.ar else [])
  for path in args.runs:
    loaded = load_run(path)
    if loaded.objective != "mdlm":
      raise SystemExit(f"{path} is a {loaded.objective} run; this probe reads mdlm runs")
    if batches is None:  # one set of batches for every run (same dataset and tokenizer)
      config = nll.data_config(loaded, data_dir=args.data_dir)
      split = nll.default_split(config)
      batches = nll.validation_batches(config, split, args.batches)
      entropy = unigram_entropy(batches)
      if args.ar:
        reference = ar_nll(args.ar, config, split, args.batches)
        print(f"AR held-out NLL on the same batches ({args.ar}): {reference:.3f}")
      print("| run | step | " + " | ".join([f"t={t}" for t in RATES] + extra)
            + " | unigram entropy |\n|---|---|" + "---|" * (len(RATES) + len(extra) + 1),
            flush=True)
    for step, model in _models(loaded, args.every_step):
      at_step = dataclasses.replace(loaded, model=model)
      ce = masked_ce_by_rate(at_step, batches)
      row = {"run": str(path), "step": step, "masked_ce": ce, "unigram_entropy": entropy}
      cells = [f"{ce[t]:.2f}" for t in RATES]
      if args.elbo_points:
        row["elbo"] = elbo(masked_ce_by_rate(at_step, batches, midpoints(args.elbo_points),
                                             seed=1))
        cells.append(f"{row['elbo']:.3f}")
      if reference is not None:
        row["elbo_over_ar_nll"] = row["elbo"] / reference
        cells.append(f"{row['elbo_over_ar_nll']:.3f}")
      rows.append(row)
      print(f"| {path} | {step} | " + " | ".join(cells) + f" | {entropy:.2f} |", flush=True)
  if args.json:
    Path(args.json).write_text(json.dumps(
        {"machine": info, "batches": args.batches, "elbo_points": args.elbo_points,
         "ar_run": args.ar or None, "ar_nll": reference, "rows": rows}, indent=1) + "\n")


if __name__ == "__main__":
  main()
