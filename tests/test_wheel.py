"""cardjax installed from its wheel (`pip install .`, as a pod job's container image is
built), used from an empty folder: the recipes travel inside the package, and nothing
reaches back into a clone of the repository.

The wheel is built from a copy of the checkout and installed with --no-deps into a new
venv; the dependencies come from this venv's site-packages through a .pth line (a real
install of jax, flax, tfds and torch into every test venv would cost minutes and the
network). That line adds the folder only: its own .pth files, among them the editable
install's finder, are not run, so `import cardjax` can only find the wheel's copy.
"""

from __future__ import annotations

import site
import subprocess
import sys
from pathlib import Path

import pytest

from fresh_machine import copy_repository, fresh_environment


def _run(args, cwd: Path, env: dict, timeout: int = 900) -> str:
  proc = subprocess.run(args, cwd=cwd, env=env, capture_output=True, text=True,
                        timeout=timeout)
  out = proc.stdout + proc.stderr
  command = " ".join(map(str, args))
  assert proc.returncode == 0, f"{command} exited {proc.returncode}:\n{out[-5000:]}"
  return out


@pytest.mark.integration  # about 3 minutes on 2 cores: `make test-integration`
def test_the_wheel_works_outside_the_repository(tmp_path):
  src = copy_repository(tmp_path / "src")
  dist = tmp_path / "dist"
  _run([sys.executable, "-m", "pip", "wheel", "-q", "--no-deps", "--no-build-isolation",
        "-w", str(dist), str(src)], tmp_path, None)
  wheel = next(dist.glob("cardjax-*.whl"))
  venv = tmp_path / "venv"
  _run([sys.executable, "-m", "venv", "--without-pip", str(venv)], tmp_path, None)
  python = venv / "bin" / "python"
  _run([sys.executable, "-m", "pip", "--python", str(python), "install", "-q", "--no-deps",
        "--no-index", str(wheel)], tmp_path, None)
  ours = _run([str(python), "-c", "import site; print(site.getsitepackages()[0])"],
              tmp_path, None).strip()
  Path(ours, "cardjax_test_dependencies.pth").write_text(
      "\n".join(site.getsitepackages()) + "\n")

  empty = tmp_path / "empty"
  empty.mkdir()
  env = fresh_environment(tmp_path, bin_dir=venv / "bin")
  where = _run([str(python), "-c", "import cardjax, cardjax.config as c; "
                "print(cardjax.__file__); print(c.recipes_dir())"], empty, env).split()
  assert all(p.startswith(ours) for p in where), where  # the wheel's package, its recipes

  out = _run([str(venv / "bin" / "cardjax"), "config", "--config", "tiny_ar"], empty, env)
  assert "tiny" in out and "objective" in out, out[-2000:]
  out = _run([str(venv / "bin" / "cardjax"), "plan", "--config", "tiny_mars",
              "--topology", "1xH100", "--estimate"], empty, env)
  assert "fits" in out, out[-2000:]
  out = _run([str(venv / "bin" / "cardjax"), "demo", "--quick", "--workdir", "runs/demo"],
             empty, env)
  for picture in ("training.png", "decoding.png"):
    assert (empty / "runs" / "demo" / picture).stat().st_size > 10_000, out[-3000:]
  assert "MARS at tau 0.95 wrote" in out
