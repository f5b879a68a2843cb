"""The stall watchdog's limits and what it does on a stall; the fault-injection spec."""

import threading
import time

import pytest

from cardjax.errors import ConfigError
from cardjax.train import exit_codes, faults
from cardjax.train.watchdog import AUTO_FLOOR_S, StallWatchdog


def test_limits_first_step_then_explicit_then_from_the_runs_pace():
  dog = StallWatchdog(timeout=0, first_timeout=900)
  assert dog.limit() == 900  # compiling
  dog.beat()
  assert dog.limit() == max(AUTO_FLOOR_S, 900)  # the pace is not known yet
  dog.intervals = [10.0, 40.0, 50.0]
  dog.steps = 4
  assert dog.limit() == 20 * 40.0
  dog.intervals = [0.1] * 5
  assert dog.limit() == AUTO_FLOOR_S
  explicit = StallWatchdog(timeout=30, first_timeout=900)
  explicit.beat()
  assert explicit.limit() == 30
  assert not StallWatchdog(timeout=-1, first_timeout=900).enabled


def test_a_stall_logs_every_threads_stack_and_exits_75(capfd):
  exited = []
  done = threading.Event()

  def fake_exit(code):
    exited.append(code)
    done.set()

  def stuck_in_a_collective():  # a name to find in the dumped stacks
    done.wait(10)

  helper = threading.Thread(target=stuck_in_a_collective)
  helper.start()
  with StallWatchdog(timeout=0.3, first_timeout=5, exit=fake_exit) as dog:
    for _ in range(3):
      dog.beat()
      time.sleep(0.05)
    assert done.wait(10)
  helper.join()
  assert exited == [exit_codes.STALLED]
  err = capfd.readouterr().err
  assert "stuck_in_a_collective" in err and "Current thread" in err


def test_steps_in_time_never_trip_it():
  exited = []
  with StallWatchdog(timeout=0.5, first_timeout=5, exit=exited.append) as dog:
    for _ in range(20):
      dog.beat()
      time.sleep(0.05)
  assert exited == []


def test_fault_specs_pick_this_process_and_attempt():
  text = "hang@5:1, kill@7, term@9:0:1"
  assert faults.parse(text, process=0, attempt=0) == {7: "kill"}
  assert faults.parse(text, process=1, attempt=0) == {5: "hang"}
  assert faults.parse(text, process=0, attempt=1) == {9: "term"}
  for bad in ("nap@5", "hang@x", "hang@0", "hang@1:2:3:4", "hang"):
    with pytest.raises(ConfigError, match="KIND@STEP"):
      faults.parse(bad, 0, 0)
