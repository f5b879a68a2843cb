"""Refill steps: while rows freed by recent reads stand empty, the scheduler runs short steps
(--refill-step forwards) so the answered clients' next requests join sooner; a whole chunk
once they are refilled, the pool is full, or a few short steps passed with nobody back."""

import pytest

from cardjax.errors import CardjaxError
from cardjax.serve.engine import Settings
from cardjax.serve.metrics import Metrics
from cardjax.serve.scheduler import REFILL_TRIES, Scheduler
from cardjax.serve.tau import TauControl

KEY = Settings("ar").pool_key()


class _Engine:
  batch_sizes = (1, 4)
  chunk = 16

  def continuous(self, settings):
    return True


class _Pool:
  def __init__(self, live: int):
    self.live = live

  def live_rows(self) -> int:
    return self.live

  def capacity(self) -> int:
    return 4


def _scheduler(refill_step=4) -> Scheduler:
  return Scheduler(_Engine(), Metrics(), TauControl(0.9), refill_step=refill_step)


def _freed(scheduler: Scheduler, rows: int) -> None:
  """What a read that freed `rows` rows leaves behind (Scheduler._read)."""
  scheduler._vacant[KEY] = scheduler._vacant.get(KEY, 0) + rows
  scheduler._tries[KEY] = REFILL_TRIES


def test_a_whole_chunk_while_no_row_was_freed():
  assert _scheduler()._forwards(KEY, _Pool(live=1), admitted=0) == 16


def test_short_steps_while_freed_rows_wait_then_a_chunk_when_nobody_comes():
  s = _scheduler()
  _freed(s, 2)
  lengths = [s._forwards(KEY, _Pool(live=2), admitted=0) for _ in range(REFILL_TRIES + 1)]
  assert lengths == [4] * REFILL_TRIES + [16]
  assert s._forwards(KEY, _Pool(live=2), admitted=0) == 16  # given up until rows free again


def test_a_chunk_once_the_freed_rows_are_refilled():
  s = _scheduler()
  _freed(s, 2)
  assert s._forwards(KEY, _Pool(live=3), admitted=1) == 4  # one still on its way
  assert s._forwards(KEY, _Pool(live=4), admitted=1) == 16


def test_a_chunk_when_the_pool_is_full():
  s = _scheduler()
  _freed(s, 2)
  assert s._forwards(KEY, _Pool(live=4), admitted=0) == 16


def test_refill_steps_are_off_by_default_and_a_bad_length_is_refused():
  s = Scheduler(_Engine(), Metrics(), TauControl(0.9))
  _freed(s, 2)
  assert s._forwards(KEY, _Pool(live=1), admitted=0) == 16
  with pytest.raises(CardjaxError, match="--refill-step=17 must lie in \\[0, --chunk=16\\]"):
    _scheduler(refill_step=17)
