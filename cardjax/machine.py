"""What machine a measurement came from: every benchmark's results carry this.

CPU wall-clock ratios depend on the processor (vector width, cache, memory bandwidth), so a
speed figure without its machine cannot be checked against another run.
"""

from __future__ import annotations

import datetime
import os
import platform
import subprocess
from pathlib import Path

# CPU flags that change how fast XLA's CPU kernels run.
FLAGS = ("avx2", "fma", "avx512f", "avx512_bf16", "avx512_vnni", "amx_bf16", "amx_tile")


def cpu_model() -> tuple[str, list[str]]:
  """(model name, the FLAGS it has) from /proc/cpuinfo, or platform's guess elsewhere."""
  try:
    text = Path("/proc/cpuinfo").read_text()
  except OSError:
    return platform.processor() or platform.machine(), []
  name, flags = platform.machine(), []
  for line in text.splitlines():
    key, _, value = line.partition(":")
    if key.strip() == "model name" and name == platform.machine():
      name = value.strip()
    elif key.strip() == "flags" and not flags:
      have = set(value.split())
      flags = [f for f in FLAGS if f in have]
  return name, flags


def commit() -> str:
  """The git commit of the checkout (with '+dirty' for uncommitted changes), or 'unknown'."""
  root = Path(__file__).resolve().parents[1]
  try:
    head = subprocess.run(["git", "rev-parse", "--short", "HEAD"], cwd=root, text=True,
                          capture_output=True, check=True).stdout.strip()
    dirty = subprocess.run(["git", "status", "--porcelain", "--untracked-files=no"], cwd=root,
                           text=True, capture_output=True, check=True).stdout.strip()
  except (OSError, subprocess.CalledProcessError):
    return "unknown"
  return head + ("+dirty" if dirty else "")


def usable_cores() -> int:
  """The cores this process may run on (its affinity mask), which can be fewer than the
  machine's: a job pinned to one core."""
  if hasattr(os, "sched_getaffinity"):
    return len(os.sched_getaffinity(0))
  return os.cpu_count() or 1


def describe() -> dict:
  """CPU model and flags, cores (all, and the ones this process may use), XLA_FLAGS,
  accelerator, jax version, commit and UTC date. XLA:CPU's float results depend on the
  usable cores even with one thread (a training seed pinned to one core and the same seed
  unpinned part at step 20: docs/reproducibility.md), so a run records both."""
  import jax

  name, flags = cpu_model()
  device = jax.devices()[0]
  return {"cpu": name, "cpu_flags": flags, "cores": os.cpu_count(),
          "usable_cores": usable_cores(), "xla_flags": os.environ.get("XLA_FLAGS", ""),
          "device": f"{device.platform}:{device.device_kind}", "jax": jax.__version__,
          "python": platform.python_version(), "commit": commit(),
          "date": datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%d %H:%M UTC")}


def line(info: dict | None = None) -> str:
  """One line for a table caption."""
  info = info or describe()
  flags = "/".join(info["cpu_flags"]) or "no AVX2"
  usable = info.get("usable_cores", info["cores"])
  cores = f"{info['cores']} cores" + (f" ({usable} usable)" if usable != info["cores"] else "")
  return (f"{info['cpu']} ({flags}), {cores}, {info['device']}, jax "
          f"{info['jax']}, commit {info['commit']}, {info['date']}")
