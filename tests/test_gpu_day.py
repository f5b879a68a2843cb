"""The prepared GPU call (benchmarks/gpu_day.sh) run as a CPU smoke test, so that it cannot
rot between GPU runs: every section writes its JSON with the documented keys, and the call
leaves no more files than the device returns."""

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from benchmarks.sections import ROW_KEYS, TIMED_TRAIN_KEYS, Section, mark

# The call's CPU smoke run these tests read takes over a minute on 2 cores:
# `make test-integration` runs them (CI too), not `make test`.
pytestmark = pytest.mark.integration

ROOT = Path(__file__).resolve().parents[1]
SECTIONS = ("decode", "forward_cost", "train_step", "attention")
FILES = {f"{s}.json" for s in SECTIONS} | {"gpu_day.md", "gpu_day.log", "machine.txt"}


def call(out: Path, seconds: str | None = None) -> subprocess.CompletedProcess:
  env = dict(os.environ, PYTHON=sys.executable)
  env.pop("XLA_FLAGS", None)  # one CPU device, as the GPU machine has one GPU
  if seconds is not None:
    env["CARDJAX_DAY_SECONDS"] = seconds
  return subprocess.run([str(ROOT / "benchmarks" / "gpu_day.sh"), str(out), "--cpu-smoke"],
                        env=env, capture_output=True, text=True, timeout=900)


@pytest.fixture(scope="module")
def smoke(tmp_path_factory):
  out = tmp_path_factory.mktemp("gpu_day")
  done = call(out)
  assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
  return out


def test_the_call_leaves_what_the_device_returns(smoke):
  names = {p.name for p in smoke.iterdir()}
  assert names == FILES
  assert all(p.is_file() for p in smoke.iterdir()) and len(names) <= 8


@pytest.mark.parametrize("name", SECTIONS)
def test_each_section_writes_its_json_with_the_documented_keys(smoke, name):
  data = json.loads((smoke / f"{name}.json").read_text())
  assert list(data)[:3] == ["section", "title", "machine"]  # the machine at the top
  assert data["section"] == name and data["smoke"] is True
  assert data["status"] == "complete", data["notes"]
  assert data["machine"]["jax"] and data["machine"]["versions"]["jaxlib"]
  assert data["rows"], f"{name} wrote no rows"
  for row in data["rows"]:
    assert set(ROW_KEYS[name]) <= set(row), (name, set(ROW_KEYS[name]) - set(row))


def test_decode_rows_hold_every_method_and_the_invariants(smoke):
  rows = json.loads((smoke / "decode.json").read_text())["rows"]
  methods = {(r["task"], r["method"]) for r in rows}
  assert {("arith", "ar"), ("arith", "mars"), ("arith", "mars --verify"), ("code", "card"),
          ("code", "dus")} <= methods
  assert all("exact_match" in r for r in rows if r["task"] == "arith")
  assert all("judge_nll" in r for r in rows if r["task"] == "code")
  # MARS at tau = 1, self-verified MARS and CARD left to right equal AR token for token.
  checked = [r for r in rows if "equals_ar" in r]
  assert len(checked) >= 4 and all(r["equals_ar"] for r in checked)


def test_train_rows_time_auto_and_say_why_a_gpu_kernel_is_skipped(smoke):
  rows = json.loads((smoke / "train_step.json").read_text())["rows"]
  timed = [r for r in rows if "skipped" not in r]
  assert {r["shape"] for r in timed} == {"tiny_mars", "tiny_mars_compact", "tiny_card"}
  assert all(r["attention"] == "auto (xla)" for r in timed)
  for r in timed:
    assert set(TIMED_TRAIN_KEYS) <= set(r) and r["finite"] and r["step_ms"] > 0
    assert r["mfu"] is None  # no peak FLOP/s for a CPU: no MFU rather than a made-up one
  skipped = [r for r in rows if "skipped" in r]
  assert {r["attention"] for r in skipped} == {"pallas_gpu", "pallas_mgpu", "cudnn"}
  assert all("runs on GPU" in r["skipped"] for r in skipped)


def test_forward_cost_is_relative_to_one_token(smoke):
  rows = json.loads((smoke / "forward_cost.json").read_text())["rows"]
  assert all(r["vs_one_token"] == 1.0 for r in rows if r["tokens"] == 1)


def test_markdown_has_every_table_under_its_machine(smoke):
  md = (smoke / "gpu_day.md").read_text()
  assert md.count("\nMachine: ") == len(SECTIONS)
  for title in ("Decode on the device", "Forward cost on the device", "Train step on one device",
                "Attention kernels"):
    assert f"## {title}" in md


def test_a_call_out_of_time_marks_every_section_skipped(tmp_path):
  done = call(tmp_path, seconds="0")
  assert done.returncode == 0, done.stdout[-2000:]
  for name in SECTIONS:
    data = json.loads((tmp_path / f"{name}.json").read_text())
    assert data["status"] == "skipped" and data["rows"] == []


def test_a_killed_section_keeps_its_rows_and_is_marked_timed_out(tmp_path):
  path = tmp_path / "forward_cost.json"
  section = Section(path, tmp_path / "gpu_day.md", "forward_cost", "t", {"x": 1})
  section.table([("model", "model", ""), ("ms", "ms", ".3f")])
  section.row({"model": "m", "ms": 1.5})
  mark(path, "timed_out", "forward_cost")  # what gpu_day.sh does after `timeout` kills it
  data = json.loads(path.read_text())
  assert data["status"] == "timed_out" and data["rows"] == [{"model": "m", "ms": 1.5}]
  assert "| m | 1.500 |" in (tmp_path / "gpu_day.md").read_text()


def test_a_finished_section_is_not_remarked(tmp_path):
  path = tmp_path / "attention.json"
  section = Section(path, None, "attention", "t", {})
  section.finish()
  mark(path, "timed_out", "attention")
  assert json.loads(path.read_text())["status"] == "complete"


def test_budget_stops_new_rows_with_a_note(tmp_path):
  section = Section(tmp_path / "s.json", None, "decode", "t", {}, budget_s=1e-9)
  assert section.over_budget()
  section.finish()
  data = json.loads((tmp_path / "s.json").read_text())
  assert data["status"] == "budget" and "budget" in data["notes"][0]


def test_the_committed_pack_loads_and_decodes(tmp_path):
  """results/bench_pack is what the GPU call decodes when no pack is carried: it must load
  with today's code and still solve the problems it solved."""
  out = tmp_path / "decode.json"
  env = dict(os.environ)
  env.pop("XLA_FLAGS", None)
  done = subprocess.run([sys.executable, "-m", "benchmarks.decode_device", "--smoke",
                         "--pack", str(ROOT / "results" / "bench_pack"), "--n-arith", "4",
                         "--max-new-arith", "96", "--json", str(out)],
                        cwd=ROOT, env=env, capture_output=True, text=True, timeout=600)
  assert done.returncode == 0, done.stdout[-2000:] + done.stderr[-2000:]
  data = json.loads(out.read_text())
  assert data["status"] == "complete" and data["sizes"]["runs"] == ["sft", "mars"]
  sft = next(r for r in data["rows"] if r["model"] == "sft")
  assert sft["exact_match"] >= 0.75  # 93.8% on 64 problems when it was packed
  assert all(r["equals_ar"] for r in data["rows"] if "equals_ar" in r)
  assert "no ar and card runs" in data["notes"][0]
