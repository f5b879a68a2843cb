"""Count XLA compilations inside a block (jax.monitoring's backend-compile event), to show
that serving after a warm-up compiles nothing."""

import contextlib
import threading

import jax

from cardjax.serve.metrics import COMPILE_EVENT

_active: list[dict] = []
_lock = threading.Lock()


def _listener(event: str, seconds: float, **_) -> None:
  if event == COMPILE_EVENT:
    with _lock:
      for counter in _active:
        counter["n"] += 1
        counter["threads"].add(threading.current_thread().name)


jax.monitoring.register_event_duration_secs_listener(_listener)  # once per process


@contextlib.contextmanager
def compiles():
  """Yields {"n": compilations so far in the block, "threads": the threads that ran them}."""
  counter = {"n": 0, "threads": set()}
  with _lock:
    _active.append(counter)
  try:
    yield counter
  finally:
    with _lock:
      _active.remove(counter)
