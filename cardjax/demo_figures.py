"""The demo's two pictures: its training curves, and exact match against tokens per forward
(each arithmetic decoder a point, AR marked), as PNGs under the demo's folder.

matplotlib is the `demo` extra (pip install 'cardjax[demo]'); without it the demo says so
and writes no picture.
"""

from __future__ import annotations

import json
from pathlib import Path


def _pyplot():
  import matplotlib
  matplotlib.use("Agg")  # files only: a demo box may have no display
  import matplotlib.pyplot as plt
  return plt


def training_curves(runs: dict[str, Path], out: Path) -> Path:
  """train/loss by step of each run (name -> run folder with metrics.jsonl), one panel."""
  plt = _pyplot()
  fig, ax = plt.subplots(figsize=(7, 4.5))
  for name, run in runs.items():
    lines = [json.loads(l) for l in (run / "metrics.jsonl").read_text().splitlines()]
    points = [(l["step"], l["train/loss"]) for l in lines if "train/loss" in l]
    ax.plot(*zip(*points), label=name)
  ax.set_xlabel("step")
  ax.set_ylabel("training loss")
  ax.set_yscale("log")
  ax.set_title("cardjax demo: training")
  ax.grid(alpha=0.3)
  ax.legend()
  fig.tight_layout()
  fig.savefig(out, dpi=120)
  plt.close(fig)
  return out


def quality_vs_speed(rows: list[dict], out: Path) -> Path:
  """Exact match (%) against tokens per forward of the arithmetic rows: AR a star, MARS
  window settings circles, block-cache ones triangles, self-verified MARS a square, each
  labelled; tau = 1 rows are left out (they write AR's tokens: the MARS model's star)."""
  plt = _pyplot()
  fig, ax = plt.subplots(figsize=(7, 4.5))
  for row in (r for r in rows if r["task"] == "arith" and "tau=1.0" not in r["setting"]):
    x, y = row["tokens_per_forward"], 100 * row["exact_match"]
    if row["method"] == "ar":
      ax.scatter(x, y, marker="*", s=220, color="black", zorder=3)
      label = f"AR, {row['model']} model"
    elif "verify" in row["method"]:
      ax.scatter(x, y, marker="s", s=70, color="tab:green", zorder=3)
      label = "MARS --verify"
    else:
      cache = "cache" in row["setting"]
      ax.scatter(x, y, marker="^" if cache else "o", s=60, zorder=3,
                 color="tab:orange" if cache else "tab:blue")
      label = row["setting"].replace("tau=", "\u03c4 ")
    ax.annotate(label, (x, y), textcoords="offset points", xytext=(6, -10 if x > 1 else 4),
                fontsize=8)
  ax.set_xlabel("tokens per forward (per row, while it generates)")
  ax.set_ylabel("exact match (%)")
  ax.set_title("cardjax demo: arithmetic, quality against tokens per forward")
  ax.grid(alpha=0.3)
  fig.tight_layout()
  fig.savefig(out, dpi=120)
  plt.close(fig)
  return out


def draw(workdir: Path, runs: dict[str, Path], rows: list[dict]) -> list[Path]:
  """Both pictures under `workdir`; [] (and a line saying why) without matplotlib."""
  try:
    _pyplot()
  except ImportError:
    print("   (no pictures: matplotlib is missing; pip install 'cardjax[demo]')")
    return []
  return [training_curves(runs, workdir / "training.png"),
          quality_vs_speed(rows, workdir / "decoding.png")]
