"""What the tests that run `cardjax train` as subprocesses share: a small tiny-config run
and the environment that makes a subprocess (or launch/local.sh's processes) run this
checkout's cardjax."""

from __future__ import annotations

import os
import sys
from pathlib import Path

import portpicker

ROOT = Path(__file__).resolve().parents[1]
SMALL = ["--config.data.options.max_files=40", "--config.data.options.validation_percent=10",
         "--config.data.seq_len=32", "--config.data.batch_size=8", "--config.train.log_every=2",
         "--config.train.progress=false", "--config.train.eval_steps=1",
         "--config.train.eval_every=0", "--config.model.hidden_size=32",
         "--config.model.intermediate_size=64", "--config.train.schedule=constant"]


def cli(*args) -> list[str]:
  """`cardjax ARGS` running this checkout, whichever interpreter runs the tests (a
  worktree has no .venv of its own)."""
  return [sys.executable, "-m", "cardjax.cli", *map(str, args)]


def checkout_env(base: dict) -> dict:
  """`base` with this checkout first on PYTHONPATH."""
  return {**base, "PYTHONPATH": os.pathsep.join([str(ROOT), base.get("PYTHONPATH", "")])}


def one_device_flags(flags: str) -> str:
  """XLA_FLAGS less the tests' simulated device count (conftest's 8): a subprocess that
  stands for one host or one user's machine gets one CPU device; other flags stay."""
  return " ".join(f for f in flags.split()
                  if not f.startswith("--xla_force_host_platform_device_count"))


def two_process_env(base: dict) -> dict:
  """The environment of launch/local.sh's two processes: one CPU device each (no forced
  device count; the tests' cheaper-compile flags are kept) and a free coordinator port."""
  env = checkout_env(base)
  env["XLA_FLAGS"] = one_device_flags(env.get("XLA_FLAGS", ""))
  env["CARDJAX_PORT"] = str(portpicker.pick_unused_port())
  return env
