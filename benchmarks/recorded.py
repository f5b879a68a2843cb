"""Compare a decode benchmark run with a recorded one, row by row, within the recorded spread.

The judge of `python -m benchmarks.check` (make bench-check) and its --compare.

A recorded figure is a range, not a point: quality spans its training seeds, tokens/s its
timing repeats. A new run reproduces a row when
- its quality (mean over seeds) lies inside the recorded seeds' range, widened by
  `quality_slack` (a mean of 3 seeds varies less than one seed does, but 3 draws do not pin
  a range's edges);
- its tokens per forward lies within `tpf_slack` (relative) of the recorded figure;
- its speedup over AR lies inside the recorded speedup range (the range of the per-round
  ratios when the row was timed in rounds with AR, `speedup_range`; else the row's slowest
  repeat over AR's fastest, to its fastest over AR's slowest), widened by `speed_slack`
  (relative), and
  only on a processor of the recorded model: a wall-clock ratio is the processor's as much as
  the method's (see docs/decoding.md), so on another one it is reported, not judged.
Rows are matched on (task, model, method, setting, batch).
"""

from __future__ import annotations

import dataclasses
from typing import Sequence

QUALITY = ("exact_match", "judge_nll")


@dataclasses.dataclass
class Verdict:
  key: tuple
  what: str  # quality | tokens/forward | speedup | missing
  ok: bool
  detail: str


def _key(row: dict) -> tuple:
  return (row["task"], row["model"], row["method"], row["setting"], row["batch"])


def _speed_range(row: dict, base: dict) -> tuple[float, float]:
  if "speedup_range" in row:  # paired with AR round by round (eval.measure.timed_against)
    return tuple(row["speedup_range"])
  low, high = row.get("tokens_per_second_range", [row["tokens_per_second"]] * 2)
  b_low, b_high = base.get("tokens_per_second_range", [base["tokens_per_second"]] * 2)
  return low / b_high, high / b_low


def _base(rows: Sequence[dict], row: dict) -> dict | None:
  """The AR row a speedup was taken against: the first row of its task and batch."""
  return next((r for r in rows if r["task"] == row["task"] and r["batch"] == row["batch"]),
              None)


def compare(recorded: dict, new: dict, quality_slack: float = 0.05, tpf_slack: float = 0.1,
            speed_slack: float = 0.1) -> list[Verdict]:
  """One Verdict per recorded row and measure (results.json of benchmarks.decode)."""
  same_cpu = recorded["machine"].get("cpu") == new["machine"].get("cpu")
  new_rows = {_key(r): r for r in new["rows"]}
  out = []
  for rec in recorded["rows"]:
    key = _key(rec)
    got = new_rows.get(key)
    if got is None:
      out.append(Verdict(key, "missing", False, "the new run has no such row"))
      continue
    metric = next(q for q in QUALITY if q in rec)
    seeds = rec.get(f"{metric}_seeds", [rec[metric]])
    low, high = min(seeds) - quality_slack, max(seeds) + quality_slack
    out.append(Verdict(key, "quality", low <= got[metric] <= high,
                       f"{metric} {got[metric]:.3f} vs recorded [{min(seeds):.3f}, "
                       f"{max(seeds):.3f}] +- {quality_slack}"))
    ratio = got["tokens_per_forward"] / max(rec["tokens_per_forward"], 1e-9)
    out.append(Verdict(key, "tokens/forward", abs(ratio - 1) <= tpf_slack,
                       f"{got['tokens_per_forward']:.2f} vs {rec['tokens_per_forward']:.2f}"))
    rec_base, new_base = _base(recorded["rows"], rec), _base(new["rows"], got)
    if rec_base is None or rec_base is rec or new_base is None:
      continue  # the baseline row itself: its speedup is 1 by definition
    s_low, s_high = _speed_range(rec, rec_base)
    s_low, s_high = s_low * (1 - speed_slack), s_high * (1 + speed_slack)
    detail = f"{got['speedup']:.2f}x vs recorded [{s_low:.2f}, {s_high:.2f}]"
    if same_cpu:
      out.append(Verdict(key, "speedup", s_low <= got["speedup"] <= s_high, detail))
    else:
      out.append(Verdict(key, "speedup", True, detail + " (another processor: not judged)"))
  return out


def report(verdicts: Sequence[Verdict]) -> str:
  lines = ["| row | measure | ok | detail |", "|---|---|---|---|"]
  for v in verdicts:
    lines.append(f"| {' / '.join(map(str, v.key))} | {v.what} | {'yes' if v.ok else 'NO'} | "
                 f"{v.detail} |")
  failed = sum(not v.ok for v in verdicts)
  lines.append(f"\n{len(verdicts) - failed} of {len(verdicts)} checks inside the recorded "
               f"spread" + (f"; {failed} outside" if failed else ""))
  return "\n".join(lines)
