"""One section of the prepared accelerator call (benchmarks/gpu_day.sh): its JSON and its
markdown table, both rewritten or appended row by row, so a section killed by its time limit
keeps every row it measured.

Every section's JSON has the same top level (docs/development.md, "The prepared GPU call"):

  {"section": "decode", "title": "...", "machine": {...}, "smoke": false,
   "status": "running" | "complete" | "budget" | "timed_out" | "failed" | "skipped",
   "sizes": {...the section's shapes and settings...}, "columns": [...], "rows": [...],
   "notes": [...], "summary": {...}}

"machine" comes first (GPU, driver, jax, jaxlib and CUDA plugin versions, the CPU, the
commit and the date). A section still "running" when read was cut off: its rows are real.
`python -m benchmarks.sections --mark FILE STATUS` sets the status of a section's JSON
(gpu_day.sh marks timed_out and skipped sections with it).

Imports no jax at module level: the marking runs in a plain Python.
"""

from __future__ import annotations

import importlib.metadata
import json
import os
import subprocess
import sys
import time
from pathlib import Path

STATUSES = ("running", "complete", "budget", "timed_out", "failed", "skipped")
# The keys every row of a section has (docs/development.md lists what each means). A
# decode row has exact_match (arith) or judge_nll (code) beside these, and equals_ar where
# an invariant applies; a train_step row that could not run has `skipped` (why) instead
# of the timings.
ROW_KEYS = {
    "decode": ("task", "model", "method", "setting", "batch", "tokens", "forwards",
               "tokens_per_forward", "tokens_per_second", "tokens_per_second_range",
               "speedup", "speedup_range", "ms_per_forward"),
    "forward_cost": ("model", "params", "batch", "tokens", "ms", "vs_one_token",
                     "tokens_per_ms"),
    "train_step": ("shape", "attention", "rows", "seq"),
    "attention": ("pattern", "length", "tokens", "batch", "pass", "kernel_ms",
                  "cudnn_masked_ms", "cudnn_causal_ms", "kernel_tflops", "cudnn_masked_tflops",
                  "cudnn_causal_tflops", "speedup_vs_masked", "share_of_causal"),
}
TIMED_TRAIN_KEYS = ("step_ms", "step_ms_all", "tokens_per_s", "model_tokens_per_s",
                    "flops_per_step", "tflops", "mfu", "peak_flops", "compile_s", "memory_gib",
                    "loss", "finite")
# Packages whose versions say what a GPU figure ran on.
VERSIONED = ("jax", "jaxlib", "jax-cuda13-plugin", "jax-cuda13-pjrt", "jax-cuda12-plugin",
             "jax-cuda12-pjrt", "flax", "libtpu")


def gpu_query() -> dict:
  """nvidia-smi's name, memory and driver of the first GPU ({} without one)."""
  try:
    out = subprocess.run(["nvidia-smi", "--query-gpu=name,memory.total,driver_version",
                          "--format=csv,noheader"], capture_output=True, text=True,
                         timeout=20, check=True).stdout.strip().splitlines()
  except (OSError, subprocess.SubprocessError):
    return {}
  if not out:
    return {}
  name, memory, driver = ([x.strip() for x in out[0].split(",")] + ["", "", ""])[:3]
  return {"gpu": name, "gpu_memory": memory, "driver": driver, "gpus": len(out)}


def versions() -> dict:
  found = {}
  for name in VERSIONED:
    try:
      found[name] = importlib.metadata.version(name)
    except importlib.metadata.PackageNotFoundError:
      pass
  return found


def machine_info() -> dict:
  """cardjax.machine.describe() (CPU, jax, device, commit, date) with the GPU, driver and
  package versions."""
  from cardjax import machine

  info = machine.describe()
  return {**gpu_query(), "versions": versions(), **info}


def machine_line(info: dict) -> str:
  from cardjax import machine

  gpu = (f"{info['gpu']} ({info.get('gpu_memory', '?')}, driver {info.get('driver', '?')}); "
         if info.get("gpu") else "")
  packages = ", ".join(f"{k} {v}" for k, v in info.get("versions", {}).items()
                       if k not in ("jax", "flax"))
  return f"{gpu}{machine.line(info)}" + (f"; {packages}" if packages else "")


def _write_json(path: Path, data: dict) -> None:
  tmp = path.with_suffix(".json.part")
  tmp.write_text(json.dumps(data, indent=1) + "\n")
  os.replace(tmp, path)  # a reader (or a kill) never sees half a file


class Section:
  """Writes OUT/NAME.json after every row and appends the section's markdown to `md`
  (the call's one markdown file) as rows come.

  columns: (key, header, format) for the markdown table; a row's other keys go to the
  JSON only."""

  def __init__(self, json_path: str | Path, md_path: str | Path | None, name: str,
               title: str, sizes: dict, smoke: bool = False, budget_s: float = 0.0):
    self.path = Path(json_path)
    self.path.parent.mkdir(parents=True, exist_ok=True)
    self.md = Path(md_path) if md_path else None
    self.start = time.perf_counter()
    self.budget_s = budget_s
    self.columns: list[tuple[str, str, str]] = []
    self.data = {"section": name, "title": title, "machine": machine_info(), "smoke": smoke,
                 "status": "running", "sizes": sizes, "columns": [], "rows": [],
                 "notes": [], "summary": {}}
    _write_json(self.path, self.data)
    self.say(f"\n## {title}\n\nMachine: {machine_line(self.data['machine'])}"
             + (" (CPU smoke run: toy sizes, the figures mean nothing)" if smoke else "")
             + f"\n\nSizes: {json.dumps(sizes)}\n")

  def say(self, text: str) -> None:
    print(text, flush=True)
    if self.md:
      with self.md.open("a") as f:
        f.write(text + "\n")

  def over_budget(self) -> bool:
    """True (and status "budget", with a note) once budget_s has passed: the caller
    starts no new row, so the section ends inside its hard limit with its rows."""
    if not self.budget_s or time.perf_counter() - self.start < self.budget_s:
      return False
    if self.data["status"] != "budget":
      self.note(f"stopped at the {self.budget_s:.0f} s budget: the rows after this were "
                "not measured")
      self.data["status"] = "budget"
      _write_json(self.path, self.data)
    return True

  def table(self, columns: list[tuple[str, str, str]], caption: str = "") -> None:
    """Start a markdown table of these columns (key, header, format spec)."""
    self.columns = columns
    self.data["columns"] = [c[0] for c in columns]
    _write_json(self.path, self.data)
    self.say((caption + "\n\n" if caption else "") + "| " + " | ".join(c[1] for c in columns)
             + " |\n|" + "---|" * len(columns))

  def row(self, row: dict) -> None:
    self.data["rows"].append(row)
    _write_json(self.path, self.data)
    cells = []
    for key, _, spec in self.columns:
      value = row.get(key)
      if value is None:
        cells.append("-")
      elif isinstance(value, float) and value != value:  # nan: a failed cell
        cells.append("failed")
      else:
        cells.append(format(value, spec) if spec else str(value))
    self.say("| " + " | ".join(cells) + " |")

  def note(self, text: str) -> None:
    self.data["notes"].append(text)
    _write_json(self.path, self.data)
    self.say(f"\n{text}")

  def finish(self, **summary) -> None:
    self.data["summary"].update(summary)
    if self.data["status"] == "running":
      self.data["status"] = "complete"
    self.data["seconds"] = round(time.perf_counter() - self.start, 1)
    _write_json(self.path, self.data)
    if summary:
      self.say("\n" + "; ".join(f"{k}: {v}" for k, v in summary.items()))

  def fail(self, error: BaseException) -> None:
    self.data["status"] = "failed"
    self.note(f"FAILED: {type(error).__name__}: {str(error)[:500]}")


def mark(path: Path, status: str, name: str) -> None:
  """Set a section's status; a section that never started gets a stub with its name."""
  if status not in STATUSES:
    raise SystemExit(f"status must be one of {STATUSES}")
  data = (json.loads(path.read_text()) if path.is_file()
          else {"section": name, "machine": {}, "status": status, "sizes": {}, "columns": [],
                "rows": [], "notes": [], "summary": {}})
  if data.get("status") == "running" or not path.is_file() or status == "skipped":
    data["status"] = status
  _write_json(path, data)


def main() -> None:
  if len(sys.argv) != 4 or sys.argv[1] != "--mark":
    raise SystemExit("usage: python -m benchmarks.sections --mark FILE STATUS")
  path = Path(sys.argv[2])
  mark(path, sys.argv[3], path.stem)


if __name__ == "__main__":
  main()
