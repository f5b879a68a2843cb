"""Two real processes (gloo collectives on localhost) feed one global batch."""

import json
import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import portpicker

from cardjax.data.tokenizer import train_bpe

WORKER = Path(__file__).with_name("multihost_data_worker.py")


def test_two_processes_build_global_batches(tmp_path):
  train_bpe([f"document number {i} word" for i in range(50)], 300, tmp_path / "tok")
  port = str(portpicker.pick_unused_port())
  env = {k: v for k, v in os.environ.items() if k != "XLA_FLAGS"}
  procs = [subprocess.Popen([sys.executable, str(WORKER), str(i), port, str(tmp_path / "tok"),
                             str(tmp_path / f"out{i}.json")], env=env,
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
           for i in range(2)]
  for p in procs:
    out, _ = p.communicate(timeout=240)
    assert p.returncode == 0, out[-3000:]
  results = [json.loads((tmp_path / f"out{i}.json").read_text()) for i in range(2)]
  assert all(r["devices"] == 4 and r["shape"] == [4, 32] for r in results)
  a, b = results
  assert len(a["global"]) == len(b["global"]) > 0  # same number of steps on both hosts
  for step, (ga, gb) in enumerate(zip(a["global"], b["global"])):
    assert ga == gb  # both see the same global batch
    # Rows 0-1 come from host 0, rows 2-3 from host 1: each host's own pipeline output.
    assert ga[:2] == a["local"][step] and ga[2:] == b["local"][step]
    tokens = np.asarray(ga)
    assert a["sums"][step] == b["sums"][step] == int((tokens * (tokens > 0)).sum())
  # The two hosts' rows are disjoint parts of the epoch.
  assert a["local"] != b["local"]
