"""The pools' program store (serve/pool/stored.py). Its cases (tests/store_cases.py: a
restart loads every program untraced and decodes the same tokens; another model, an
unreadable file and a full disk) run in a pytest process of their own, so the executables
they load never share a process with the rest of the suite; here too a second process
loads what a first one stored, and `stored.use` sets the default store."""

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from cardjax.serve.pool import stored
from cardjax.serve.pool.slots import SlotPool
from decoding_helpers import tiny_model

ROOT = Path(__file__).resolve().parents[1]


@pytest.mark.integration  # a fresh pytest process, a minute of compiles on 2 cores
def test_the_store_cases_pass_in_a_process_of_their_own():
  out = subprocess.run([sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider",
                        "-p", "no:xdist", "tests/store_cases.py"], cwd=ROOT,
                       capture_output=True, text=True, timeout=900)
  assert out.returncode == 0, out.stdout[-6000:] + out.stderr[-3000:]
  assert " passed" in out.stdout and "failed" not in out.stdout


def test_use_sets_the_default_store_and_an_empty_folder_turns_it_off(tmp_path):
  try:
    stored.use(str(tmp_path))
    assert stored.default().folder == tmp_path / stored.FOLDER
    assert SlotPool(tiny_model(), "ar", slots=48, batch_sizes=(1,)).store is stored.default()
    stored.use("")
    assert stored.default() is None
    assert SlotPool(tiny_model(), "ar", slots=48, batch_sizes=(1,)).store is None
  finally:
    stored.use("")


_RESTART = """
import json, sys
sys.path[:0] = [{tests!r}]
from cardjax.serve.pool.stored import ProgramStore
from decoding_helpers import tiny_model
from store_cases import serve
store = ProgramStore({folder!r})
got = serve(tiny_model(), "ar", store)
print(json.dumps([store.loaded, store.compiled, got[0]]))
"""


@pytest.mark.integration  # two fresh processes, each importing jax and compiling
def test_a_new_process_loads_what_the_last_one_stored(tmp_path):
  # The disk key must name a program the same way in every process (no object ids or
  # addresses in it): a second process loads all, compiles none.
  script = _RESTART.format(tests=str(ROOT / "tests"), folder=str(tmp_path))
  env = {k: v for k, v in os.environ.items() if k != "XLA_FLAGS"}

  def run():
    out = subprocess.run([sys.executable, "-c", script], cwd=ROOT, env=env, check=True,
                         capture_output=True, text=True, timeout=600)
    return json.loads(out.stdout.strip().splitlines()[-1])

  loaded, compiled, tokens = run()
  assert loaded == 0 and compiled > 0
  assert run() == [compiled, 0, tokens]
