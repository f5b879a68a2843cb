"""`make demo` and the kept runs on a machine that has never built cardjax.

The demo's first run once failed on every machine but the ones it was developed on: the
kept instruct model's run config named their data folder, and the decode stage read its
arithmetic problems from there. Two checks: no committed checkpoint or result pack holds
an absolute path of the machine that wrote it, and the demo runs from a copy of the
repository in a new folder with an empty HOME, XDG_CACHE_HOME and CARDJAX_DATA_DIR.
"""

from __future__ import annotations

import json
import re
import subprocess
import sys
from pathlib import Path

import pytest

from fresh_machine import ROOT, copy_repository, fresh_environment

# An absolute path of a machine: a POSIX root folder a build would write under.
MACHINE_PATH = re.compile(r"(?<![\w.:/])/(work|home|root|tmp|Users|mnt|scratch|data)/")


def kept_files() -> list[Path]:
  """Every committed checkpoint step's files and every result pack's (what code reads)."""
  listed = subprocess.run(["git", "ls-files", "results"], cwd=ROOT, capture_output=True,
                          text=True, check=True).stdout.split()
  steps = re.compile(r"(^|/)checkpoints/\d+/|(^|/)bench_pack/")
  return [ROOT / name for name in listed if steps.search(name)]


def test_kept_runs_hold_no_path_of_the_machine_that_wrote_them():
  files = kept_files()
  assert any(f.parts[-2:] == ("config", "metadata") for f in files), "no kept run config"
  found = []
  for path in files:
    try:
      text = path.read_text(encoding="utf-8")
    except UnicodeDecodeError:  # array data
      continue
    found += [f"{path.relative_to(ROOT)}: {m.group(0)}..." for m in MACHINE_PATH.finditer(text)]
  assert not found, "kept runs name folders of the machine that wrote them:\n" + "\n".join(found)


def test_a_stored_data_folder_missing_here_is_replaced_by_the_callers(tmp_path, caplog):
  """A run config's data.data_dir that does not exist on this machine becomes "" (the
  caller's $CARDJAX_DATA_DIR or ~/tensorflow_datasets), said once; one that exists, or a
  bucket's, is kept."""
  from cardjax.config import base_config
  from cardjax.restore import local_data_dir

  config = base_config()
  config.data.data_dir = str(tmp_path / "elsewhere" / "data")
  with caplog.at_level("WARNING", logger="cardjax.restore"):
    assert local_data_dir(config, "run A").data.data_dir == ""
    config.data.data_dir = str(tmp_path / "elsewhere" / "data")
    local_data_dir(config, "run A")
  said = [r.getMessage() for r in caplog.records if "not on this machine" in r.getMessage()]
  assert len(said) == 1 and "run A" in said[0] and "elsewhere" in said[0]
  for kept in (str(tmp_path), "gs://bucket/data", ""):
    config.data.data_dir = kept
    assert local_data_dir(config).data.data_dir == kept


def test_pack_runs_leaves_no_machine_path(tmp_path):
  """benchmarks.pack_runs.portable: a packed step's config and commit markers lose the
  absolute paths of the machine that trained it; everything else is kept."""
  from benchmarks.pack_runs import portable

  step = tmp_path / "checkpoints" / "7"
  (step / "config").mkdir(parents=True)
  config = {"data": {"data_dir": "/work/x/data", "dataset": "arith_sft", "tokenizer": ""},
            "train": {"init_from": "/home/u/runs/sft/checkpoints", "steps": 7,
                      "lora": {"base": "gs://b/base"}}}
  (step / "config" / "metadata").write_text(json.dumps(config))
  (step / "commit_success.txt").write_text(f"Checkpoint commit was successful to {step}")
  portable(step)
  after = json.loads((step / "config" / "metadata").read_text())
  assert after["data"] == {"data_dir": "", "dataset": "arith_sft", "tokenizer": ""}
  assert after["train"] == {"init_from": "", "steps": 7, "lora": {"base": "gs://b/base"}}
  assert str(tmp_path) not in (step / "commit_success.txt").read_text()


@pytest.mark.integration  # about 3 minutes on 2 cores: `make test-integration`
def test_demo_runs_from_a_new_clone_on_a_new_machine(tmp_path):
  """The full demo's path (MARS from the kept instruct model, the decode stage on 128
  problems read from the demo's own data folder) at 20 steps a model, run by the copy's
  own code from the copy's folder."""
  clone = copy_repository(tmp_path / "clone")
  env = fresh_environment(tmp_path)
  env["PYTHONPATH"] = str(clone)  # the copy's cardjax, before the editable install's
  command = [sys.executable, "-c", "import sys, cardjax; assert cardjax.__file__.startswith("
             f"{str(clone)!r}), cardjax.__file__; from cardjax.cli import main; sys.exit(main())",
             "demo", "--steps", "20", "--workdir", "runs/demo"]
  proc = subprocess.run(command, cwd=clone, env=env, capture_output=True, text=True,
                        timeout=1200)
  out = proc.stdout + proc.stderr
  assert proc.returncode == 0, out[-6000:]
  assert "(kept, loaded from" in out, out[-3000:]
  assert "MARS at tau 0.95 wrote" in out and "mars --verify" in out, out[-3000:]
  demo = clone / "runs" / "demo"
  for picture in ("training.png", "decoding.png"):
    assert f"picture: {demo / picture}" in out
    assert (demo / picture).stat().st_size > 10_000
  # Nothing was read from, or written to, this machine's own folders.
  assert not (Path(env["HOME"]) / "tensorflow_datasets").exists()
  assert list((demo / "data" / "arith_sft").glob("*/1.0.0/dataset_info.json"))
