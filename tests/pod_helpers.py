"""Multi-host `cardjax train` jobs as real processes on this machine (gloo over loopback),
started one by one so that a test can signal, stop or watch each host: what the pod
failure tests share."""

from __future__ import annotations

import json
import os
import subprocess
import time
from pathlib import Path

import numpy as np
from launch_helpers import ROOT, SMALL, cli, two_process_env


class Hosts:
  """`cardjax train ARGS` as `count` processes of one job; each host's output goes to
  LOGS/host_i.log (files, not pipes: a chatty host never blocks on a full pipe). host_env:
  each host's own variables (hosts of a real job are separate machines)."""

  def __init__(self, count: int, args: list, logs: Path, env: dict | None = None,
               host_env: dict[int, dict] | None = None):
    env = two_process_env(dict(os.environ) if env is None else env)
    port = env.pop("CARDJAX_PORT")
    logs.mkdir(parents=True, exist_ok=True)
    self.logs = [logs / f"host_{i}.log" for i in range(count)]
    self.procs = []
    for i, log in enumerate(self.logs):
      host_env = {**env, "CARDJAX_COORDINATOR": f"127.0.0.1:{port}",
                  "CARDJAX_NUM_PROCESSES": str(count), "CARDJAX_PROCESS_ID": str(i),
                  "JAX_PLATFORMS": "cpu", **(host_env or {}).get(i, {})}
      with open(log, "w") as out:
        self.procs.append(subprocess.Popen(cli("train", *args), env=host_env, cwd=ROOT,
                                           stdout=out, stderr=subprocess.STDOUT))

  def wait(self, timeout: float) -> list[int]:
    deadline = time.monotonic() + timeout
    codes = []
    for proc in self.procs:
      try:
        codes.append(proc.wait(timeout=max(deadline - time.monotonic(), 1)))
      except subprocess.TimeoutExpired:
        self.kill()
        raise AssertionError(f"hosts still running after {timeout} s:\n{self.tail()}")
    return codes

  def kill(self) -> None:
    for proc in self.procs:
      if proc.poll() is None:
        proc.kill()
        proc.wait()

  def output(self, i: int) -> str:
    return self.logs[i].read_text(errors="replace")

  def tail(self, chars: int = 3000) -> str:
    return "\n".join(f"--- host {i}:\n{self.output(i)[-chars:]}" for i in range(len(self.logs)))


def train_args(workdir, data_dir, steps: int, *extra) -> list[str]:
  return ["--config", "configs/tiny_ar.py", "--workdir", str(workdir),
          f"--config.data.data_dir={data_dir}", *SMALL, f"--config.train.steps={steps}",
          *extra]


def logged_steps(workdir) -> list[int]:
  path = Path(workdir) / "metrics.jsonl"
  if not path.exists():
    return []
  return [json.loads(line)["step"] for line in path.read_text().splitlines() if line.strip()]


def wait_for_step(workdir, step: int, hosts: Hosts, timeout: float = 300) -> None:
  """Until process 0 has logged `step` (the job is past its compile and training)."""
  deadline = time.monotonic() + timeout
  while not any(s >= step for s in logged_steps(workdir)):
    if any(p.poll() is not None for p in hosts.procs) or time.monotonic() > deadline:
      hosts.kill()
      raise AssertionError(f"the job did not reach step {step}:\n{hosts.tail()}")
    time.sleep(0.1)


def checkpoint_steps(workdir) -> list[int]:
  folder = Path(workdir) / "checkpoints"
  if not folder.is_dir():
    return []
  return sorted(int(p.name) for p in folder.iterdir() if p.name.isdigit())


def final_params(workdir) -> list[np.ndarray]:
  import jax
  from flax import nnx

  from cardjax import checkpoint
  model, _ = checkpoint.restore_model(Path(workdir) / "checkpoints")
  return [np.asarray(p) for p in jax.tree.leaves(nnx.state(model, nnx.Param))]


def assert_same_weights(a, b) -> None:
  for x, y in zip(final_params(a), final_params(b), strict=True):
    np.testing.assert_array_equal(x, y)
