"""Events from the decode thread to the HTTP event loop, handed over once a round.

Each `call_soon_threadsafe` wakes the event loop through its self-pipe; one per delivered
delta meant up to a wake-up per request per step on the decode thread's clock. The decode
thread instead puts a round's events here (`put`) and hands them over together (`flush`,
which the scheduler calls once a round's answers are out, before it waits for arrivals):
one wake-up per event loop per round, and the loop then fills every request's queue.
"""

from __future__ import annotations

import asyncio
import threading


class Handoff:
  def __init__(self):
    self._lock = threading.Lock()
    self._pending: dict = {}  # event loop -> [(queue, item), ...]

  def put(self, loop: asyncio.AbstractEventLoop, queue: asyncio.Queue, item) -> None:
    with self._lock:
      self._pending.setdefault(loop, []).append((queue, item))

  def flush(self) -> None:
    with self._lock:
      pending, self._pending = self._pending, {}
    for loop, items in pending.items():
      try:
        loop.call_soon_threadsafe(_drain, items)
      except RuntimeError:  # the event loop has closed: nobody is listening any more
        pass


def _drain(items) -> None:
  for queue, item in items:
    queue.put_nowait(item)
