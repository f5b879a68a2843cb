"""benchmarks/serve_overhead.py --quick: two `cardjax serve` starts (the second from the
compilation cache), two levels against the bare SlotPool loop, and the JSON it writes."""

import json
import math
import subprocess
import sys

import pytest
from serve_helpers import server_env

from benchmarks.common import ROOT

# Over a minute each on 2 cores: `make test-integration` runs them (CI too), not
# `make test`.
pytestmark = pytest.mark.integration

LEVEL_KEYS = {"method", "clients", "server_tokens_per_s", "bare_tokens_per_s", "ratio",
              "rows_per_step"}


def test_quick_run_writes_a_level_per_client_count(tmp_path):
  out = tmp_path / "overhead.json"
  # A process of its own without the 8 simulated devices: the bare loop then runs on one,
  # as the servers it starts do.
  done = subprocess.run([sys.executable, "-m", "benchmarks.serve_overhead", "--quick",
                         "--json", str(out), "--out", str(tmp_path / "work")], cwd=ROOT,
                        env=server_env(), capture_output=True, text=True, timeout=300)
  assert done.returncode == 0, done.stdout + done.stderr
  report = json.loads(out.read_text())
  assert {"levels", "warmup_first_s", "warmup_cached_s", "machine"} <= set(report)
  assert {"cpu", "device", "jax"} <= set(report["machine"])
  for key in ("warmup_first_s", "warmup_cached_s"):
    assert math.isfinite(report[key]) and report[key] > 0, (key, report[key])
  levels = report["levels"]
  assert [(r["method"], r["clients"]) for r in levels] == [("ar", 1), ("ar", 4)]
  for r in levels:
    assert LEVEL_KEYS <= set(r)
    for key in LEVEL_KEYS - {"method", "clients"}:
      assert math.isfinite(r[key]) and r[key] > 0, (r["clients"], key, r[key])
    assert r["rows_per_step"] <= r["clients"]
    assert r["first_burst_tokens_per_s"] > 0
    assert r["compilations_after_warmup"] == 0  # the default warm-up left nothing to compile
  assert levels[0]["rows_per_step"] == 1  # one client: one row a step
  assert "| ar | 4 |" in done.stdout
