"""What several benchmarks share: table cells, run folders, timing, reports, plots, the machine.

Kept free of jax at import time (jax is imported inside the helpers that need it), so that
a benchmark's --help and a parent process that only starts others stay quick.
"""

from __future__ import annotations

import argparse

import statistics
import time
from pathlib import Path
from typing import Callable, Sequence

from cardjax import machine

# The repo root: the benchmarks read configs/ and docs/ from it and start servers in it.
ROOT = Path(__file__).resolve().parents[1]


def range_cell(centre: float, low: float, high: float, digits: int = 2, unit: str = "") -> str:
  """'centre [low-high]' to `digits` decimals, the unit after the centre only: the one
  form of every "mean [range]" and "median [range]" cell (e.g. '1.25x [1.10-1.40]')."""
  f = f".{digits}f"
  return f"{centre:{f}}{unit} [{low:{f}}-{high:{f}}]"


def spread(values: Sequence[float], digits: int = 2, unit: str = "",
           centre: Callable = statistics.mean) -> str:
  """range_cell of `values`: their mean (or `centre`, e.g. statistics.median) and range."""
  return range_cell(centre(values), min(values), max(values), digits, unit)


def run_dir(workdir: Path, name: str, seed: int) -> Path:
  """Where decode.py trains a model: seed 0's runs in workdir/runs/NAME (where bench-pack
  and --no-train look), any other seed's in workdir/runs/seedS/NAME."""
  return workdir / "runs" / (name if seed == 0 else f"seed{seed}/{name}")


def timed(fn, *args, repeats: int = 5) -> float:
  """Median seconds of one call of a jax function, after a compile-and-warm call."""
  import jax

  jax.block_until_ready(fn(*args))
  times = []
  for _ in range(repeats):
    t0 = time.perf_counter()
    jax.block_until_ready(fn(*args))
    times.append(time.perf_counter() - t0)
  return float(statistics.median(times))


class Tee:
  """Prints lines and appends them to a file (when given) as they come, so a run cut short
  keeps what it measured. `start`, when given, replaces the file's contents first (a new
  report); without it the lines are added to what the file holds."""

  def __init__(self, path: str | Path | None, start: str | None = None):
    self.path = Path(path) if path else None
    if self.path and start is not None:
      self.path.parent.mkdir(parents=True, exist_ok=True)
      self.path.write_text(start)

  def __call__(self, line: str = "") -> None:
    print(line, flush=True)
    if self.path:
      with self.path.open("a") as f:
        f.write(line + "\n")


def pyplot():
  """matplotlib.pyplot on the file-only Agg backend (no display on a benchmark box).
  Raises ImportError without matplotlib (pip install -e '.[bench]')."""
  import matplotlib
  matplotlib.use("Agg")
  import matplotlib.pyplot as plt

  return plt


def announce(title: str = "", out: Callable[[str], None] = print) -> dict:
  """Print '== [TITLE: ]the machine line' (cardjax/machine.py) and return the machine's
  description, which the benchmark saves with its results."""
  info = machine.describe()
  text = f"== {title}: {machine.line(info)}" if title else f"== {machine.line(info)}"
  if out is print:
    print(text, flush=True)
  else:
    out(text)
  return info


def arg_parser(spec, doc: str | None) -> argparse.ArgumentParser:
  """A benchmark's parser: its docstring as the description, kept as written, and
  `python -m benchmarks.X` as the program name in its usage line (`spec`: the module's
  __spec__, None when it was run as a file)."""
  return argparse.ArgumentParser(prog=f"python -m {spec.name}" if spec else None,
                                 description=doc,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
