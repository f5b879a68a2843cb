"""What the CARD claims study concludes from its curves: best epoch counts, the crossover,
and the table and picture (benchmarks/studies/card_claims.py writes them)."""

from __future__ import annotations

import statistics
from pathlib import Path

from cardjax import machine

from benchmarks.common import range_cell, spread


def mean_curve(curves: list[list]) -> list:
  """The seeds' mean at each point (None where no seed has one)."""
  out = []
  for values in zip(*curves):
    got = [v for v in values if v is not None]
    out.append(statistics.mean(got) if got else None)
  return out


def crossover(points: list, ar: list, other: list):
  """The first point at which `other`'s mean curve is below AR's, or None."""
  for point, a, b in zip(points, mean_curve(ar), mean_curve(other)):
    if a is not None and b is not None and b < a:
      return point
  return None


def summarise(result: dict) -> dict:
  """Adds best / best_epoch (per seed), crossover_epoch (CARD, the paper's recipe) and
  crossover_by_run to an epochs result; card_over_ar per point to a budgets result."""
  nll = result["val_nll"]
  if "budgets" in result:
    ar = mean_curve(nll["ar"])
    result["card_over_ar"] = {name: [None if a is None or c is None else c / a
                                     for a, c in zip(ar, mean_curve(curve))]
                              for name, curve in nll.items() if name != "ar"}
    return result
  epochs = result["epochs"]
  result["best"] = {name: [min(c) for c in curves] for name, curves in nll.items()}
  result["best_epoch"] = {name: [epochs[c.index(min(c))] for c in curves]
                          for name, curves in nll.items()}
  result["crossover_by_run"] = {name: crossover(epochs, nll["ar"], curves)
                                for name, curves in nll.items() if name != "ar"}
  result["crossover_epoch"] = result["crossover_by_run"].get("card")
  ar_best = statistics.mean(result["best"]["ar"])
  result["best_over_ar"] = {name: statistics.mean(best) / ar_best
                            for name, best in result["best"].items() if name != "ar"}
  return result


def _cell(values: list, digits: int = 3) -> str:
  got = [v for v in values if v is not None]
  if not got:
    return "-"
  return spread(got, digits) if len(got) > 1 else f"{got[0]:.{digits}f}"


def table(result: dict) -> str:
  nll = result["val_nll"]
  names = list(nll)
  budgets = "budgets" in result
  points = result["budgets"] if budgets else result["epochs"]
  head = "steps | epochs of data" if budgets else "epochs"
  lines = [f"Validation NLL in AR order, mean [range] over seeds {result['seeds']}; "
           f"{result['corpus']}, {result['train_tokens']:,} training tokens.", "",
           f"| {head} | " + " | ".join(names) + " |",
           "|---" * (len(names) + (2 if budgets else 1)) + "|"]
  for i, point in enumerate(points):
    lead = f"{point} | {result['epochs_of_data'][i]:.2f}" if budgets else str(point)
    lines.append(f"| {lead} | " + " | ".join(_cell([c[i] for c in nll[n]]) for n in names)
                 + " |")
  lines.append("")
  if budgets:
    for name, ratios in result["card_over_ar"].items():
      lines.append(f"{name} / ar: " + ", ".join(
          f"{p} steps {r:.3f}" for p, r in zip(points, ratios) if r is not None))
  else:
    for name in names:
      lines.append(f"best {name}: {_cell(result['best'][name])} at epochs "
                   f"{result['best_epoch'][name]}")
    for name, epoch in result["crossover_by_run"].items():
      lines.append(f"{name} below ar at equal epochs from: "
                   f"{'never (in the listed epochs)' if epoch is None else f'epoch {epoch}'}; "
                   f"best {name} / best ar: {result['best_over_ar'][name]:.3f}")
  timing = result.get("step_time")
  if timing:
    lines.append("train step, median [range] of " + str(len(timing["seconds"]["ar"])) +
                 " interleaved rounds: " + ", ".join(
                     f"{label.replace('_over_', '/')} " +
                     range_cell(timing[label], *timing["spread"][label])
                     for label in timing["spread"]))
  lines.append(f"machine: {machine.line(result['machine'])}")
  return "\n".join(lines)


def draw(result: dict, path: Path):
  """Validation NLL against epochs (or steps), the seeds' mean as a line and their range as
  a band; None without matplotlib."""
  try:
    from benchmarks.common import pyplot
    plt = pyplot()
  except ImportError:
    return None
  budgets = "budgets" in result
  points = result["budgets"] if budgets else result["epochs"]
  fig, ax = plt.subplots(figsize=(6.4, 4.2))
  for name, curves in result["val_nll"].items():
    xs = [p for i, p in enumerate(points) if any(c[i] is not None for c in curves)]
    cols = [[c[i] for c in curves if c[i] is not None] for i in range(len(xs))]
    mean = [statistics.mean(v) for v in cols]
    ax.plot(xs, mean, marker="o", label=name)
    ax.fill_between(xs, [min(v) for v in cols], [max(v) for v in cols], alpha=0.2)
  ax.set_xscale("log", base=2)
  ax.set_xlabel("training steps" if budgets else "epochs over the capped training split")
  ax.set_ylabel("validation NLL (AR order)")
  ax.set_title(f"{result['corpus']}: {result['train_tokens']:,} training tokens")
  ax.legend()
  fig.tight_layout()
  fig.savefig(path, dpi=110)
  plt.close(fig)
  return path
