"""The report of `cardjax eval`: a table on the terminal and a JSON file.

JSON layout (docs/evaluation.md): {"machine", "task", "settings", "runs": [{"checkpoint",
"step", "objective", "metrics", "examples"?}], "difference"?}. With --compare, "runs" holds
both checkpoints in order and "difference" is the second's metrics minus the first's.
"""

from __future__ import annotations

import json
from pathlib import Path

from cardjax.storage import checked_path

# The rows of the table, in order: the task's headline first, then speed.
SHOWN = ("ar_nll", "perplexity", "loss", "batches", "target_tokens", "exact_match", "correct",
         "n", "tokens", "forwards", "tokens_per_forward", "tokens_per_second", "seconds")


def difference(first: dict, second: dict) -> dict:
  """second - first for every number both metrics have (booleans are not numbers here)."""
  out = {}
  for key, a in first.items():
    b = second.get(key)
    if all(isinstance(v, (int, float)) and not isinstance(v, bool) for v in (a, b)):
      out[key] = b - a
  return out


def build(machine: dict, task: dict, settings: dict, runs: list[dict]) -> dict:
  report = {"machine": machine, "task": task, "settings": settings, "runs": runs}
  if len(runs) == 2:
    report["difference"] = difference(runs[0]["metrics"], runs[1]["metrics"])
  return report


def _fmt(key: str, value) -> str:
  if isinstance(value, bool) or not isinstance(value, (int, float)):
    return str(value)
  if key == "exact_match":
    return f"{100 * value:.1f}%"
  if isinstance(value, int):
    return f"{value:,}"
  return f"{value:.4f}" if abs(value) < 100 else f"{value:,.1f}"


def table(report: dict) -> str:
  """A markdown table: a metric a row, a checkpoint a column (and their difference)."""
  runs = report["runs"]
  heads = [f"{r['checkpoint']} (step {r['step']})" for r in runs]
  if "difference" in report:
    heads.append("difference")
  lines = ["| metric | " + " | ".join(heads) + " |", "|---" * (len(heads) + 1) + "|"]
  for key in SHOWN:
    if key not in runs[0]["metrics"]:
      continue
    cells = [_fmt(key, r["metrics"].get(key, "")) for r in runs]
    if "difference" in report:
      delta = report["difference"].get(key)
      cells.append("" if delta is None else ("+" if delta >= 0 else "") + _fmt(key, delta))
    lines.append(f"| {key} | " + " | ".join(cells) + " |")
  return "\n".join(lines)


def write(report: dict, path: str | Path) -> Path:
  path = checked_path(path)  # local, gs:// or s3://
  path.parent.mkdir(parents=True, exist_ok=True)
  path.write_text(json.dumps(report, indent=1) + "\n")
  return path
