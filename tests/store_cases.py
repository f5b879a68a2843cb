"""Cases of the pools' program store (serve/pool/stored.py), run by
tests/test_serve_stored.py in a pytest process of their own, so that the executables they
load from disk never share a process with the rest of the suite: a restart loads every
program it ran before, untraced and uncompiled, and decodes the same tokens; a program of
another model, or a file that does not load, is compiled rather than used; a full disk
stores nothing and serves on."""

import dataclasses
import logging

import pytest

from cardjax.decoding import ar, mars
from cardjax.model import create_model
from cardjax.serve.pool import slots, stored
from cardjax.serve.pool.slots import SlotPool
from cardjax.serve.pool.stored import ProgramStore
from compile_count import compiles
from decoding_helpers import CONFIG, MASK, PROMPTS, tiny_model

N = 7  # tokens per request


def serve(model, method, store):
  """Two rows admitted, stepped to their budgets through a tier change and released; a
  third admitted after. Returns each request's tokens."""
  pool = SlotPool(model, method, slots=48, batch_sizes=(1, 2), span_min=0, store=store)
  got = {}

  def run(keys):
    while any(k in pool.owner for k in keys):
      new, ended, _ = pool.step(3)
      for k, toks in new.items():
        got.setdefault(k, []).extend(toks)
      for k in ended:
        pool.release(k)

  pool.admit_many([(0, PROMPTS[0], 1.0, N), (1, PROMPTS[2], 1.0, N)])
  run([0, 1])
  pool.admit(2, PROMPTS[3], 1.0, N)
  run([2])
  return got


@pytest.fixture(autouse=True)
def fresh_process():
  """Each test starts as a new server's process would: no compiled prefill of the model
  kept by earlier pools (slots.jitted), which would spare the first store their compiles."""
  slots.jitted.cache_clear()


def restart(folder):
  """A store as a restarted server has it: nothing in memory, the folder as it was left;
  and no compiled prefill kept by the process's pools of the model (slots.jitted)."""
  slots.jitted.cache_clear()
  return ProgramStore(folder)


def reference(model, method, prompt):
  if method == "ar":
    return ar.generate(model, [prompt], N).rows()[0]
  return mars.generate(model, [prompt], N, block=4, tau=1.0, mask_id=MASK).rows()[0]


@pytest.mark.parametrize("method", ["ar", "mars"])
def test_a_restarted_pool_loads_every_program_and_decodes_the_same_tokens(tmp_path, method):
  model = tiny_model()
  first = ProgramStore(tmp_path)
  got = serve(model, method, first)
  for k, prompt in enumerate([PROMPTS[0], PROMPTS[2], PROMPTS[3]]):
    assert got[k] == reference(model, method, prompt), k
  assert first.compiled > 0 and first.loaded == 0
  assert len(list(tmp_path.glob("*.bin"))) == first.compiled

  again = restart(tmp_path)
  with compiles() as counted:
    assert serve(model, method, again) == got
  assert (again.loaded, again.compiled) == (first.compiled, 0)
  assert counted["n"] == 0


def test_another_model_of_the_same_shapes_compiles_its_own_programs(tmp_path):
  # Same weight shapes, another rotary base: the programs differ though no shape does.
  other = create_model(dataclasses.replace(CONFIG, rope_theta=500.0), seed=1)
  store = ProgramStore(tmp_path)
  serve(tiny_model(), "ar", store)
  before = store.compiled
  got = serve(other, "ar", store)
  assert got[0] == reference(other, "ar", PROMPTS[0])
  assert store.compiled > before  # its step and prefills were not taken from the first


def test_a_program_that_does_not_load_is_compiled_again_and_replaced(tmp_path, caplog):
  model = tiny_model()
  first = ProgramStore(tmp_path)
  got = serve(model, "ar", first)
  step = sorted(tmp_path.glob("step-*.bin"))
  step[0].write_bytes(b"half a program")  # what a foreign or torn file reads as
  again = restart(tmp_path)
  with caplog.at_level(logging.WARNING, logger=stored.__name__):
    assert serve(model, "ar", again) == got
  assert again.compiled == 1 and again.loaded == first.compiled - 1
  assert "did not load" in caplog.text and step[0].name in caplog.text
  third = restart(tmp_path)  # the replacement loads
  serve(model, "ar", third)
  assert (third.loaded, third.compiled) == (first.compiled, 0)


def test_a_full_disk_leaves_no_program_file_and_serving_goes_on(tmp_path, caplog, monkeypatch):
  model = tiny_model()

  def full(*_):
    raise OSError(28, "No space left on device")

  monkeypatch.setattr(stored.os, "replace", full)
  store = ProgramStore(tmp_path)
  with caplog.at_level(logging.WARNING, logger=stored.__name__):
    got = serve(model, "ar", store)
  assert got[0] == reference(model, "ar", PROMPTS[0])
  assert list(tmp_path.iterdir()) == []  # neither a program nor a partial one
  assert "No space left on device" in caplog.text
