"""The server's Prometheus metrics, in a registry of its own (served at /metrics)."""

from __future__ import annotations

import collections
import threading
import time
import urllib.request

from prometheus_client import (CollectorRegistry, Counter, Gauge, Histogram,
                               generate_latest)

# Seconds: CPU decoding of small models spans milliseconds to minutes.
BUCKETS = (0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 25, 60, 120, 300)
WINDOW_S = 10.0  # tokens/s is measured over this many recent seconds
# jax's event for one XLA compilation (jax._src.dispatch.BACKEND_COMPILE_EVENT in 0.10 and
# 0.11); a program loaded from the persistent compilation cache does not raise it.
COMPILE_EVENT = "/jax/core/compile/backend_compile_duration"


class Metrics:
  def __init__(self):
    r = self.registry = CollectorRegistry()
    self.requests = Counter("cardjax_requests", "Requests by final status "
                            "(ok, bad_request, cancelled, error)", ["status"], registry=r)
    self.tokens = Counter("cardjax_generated_tokens", "Tokens generated", registry=r)
    self.forwards = Counter("cardjax_forwards", "Decode forwards (row-forwards of served "
                            "requests)", registry=r)
    self.prefills = Counter("cardjax_prefills", "Prompt prefills: one per request when its "
                            "row keeps its KV cache (AR, MARS), one per row per chunk "
                            "otherwise", registry=r)
    self.prefix_tokens = Counter("cardjax_prefix_cached_tokens", "Prompt tokens read from "
                                 "the shared-prefix cache instead of prefilled", registry=r)
    self.tokens_per_s = Gauge("cardjax_tokens_per_second",
                              f"Tokens generated per second over the last {WINDOW_S:g} s",
                              registry=r)
    self.tokens_per_forward = Gauge("cardjax_tokens_per_forward",
                                    "Tokens per row-forward of the last decode chunk",
                                    registry=r)
    self.queue = Gauge("cardjax_queue_depth", "Requests waiting for a batch row", registry=r)
    self.running = Gauge("cardjax_running_requests", "Requests holding a batch row",
                         registry=r)
    self.tau = Gauge("cardjax_mars_tau", "The server's MARS tau (load-aware or fixed)",
                     registry=r)
    self.steps = Counter("cardjax_decode_steps", "Slot-pool decode steps launched: chunk "
                         "(--chunk forwards) or refill (--refill-step forwards, while freed "
                         "rows wait for new requests)", ["kind"], registry=r)
    self.batch_rows = Histogram("cardjax_batch_rows", "Requests per decode call (before "
                                "padding to a compiled batch size)",
                                buckets=(1, 2, 4, 8, 16, 32, 64, 128), registry=r)
    self.ttft = Histogram("cardjax_time_to_first_token_seconds", "Arrival to first token",
                          buckets=BUCKETS, registry=r)
    self.latency = Histogram("cardjax_request_latency_seconds", "Arrival to last token",
                             buckets=BUCKETS, registry=r)
    # Where the decode thread's time goes: with a level's wall time, what bounds throughput
    # (a step's cost, the prefills, the admission wait, or idle waiting for requests).
    self.thread_seconds = Counter("cardjax_decode_thread_seconds", "Decode thread time by "
                                  "phase: prefill (admitting rows), step (decode forwards), "
                                  "deliver (answers out), admit_wait (--admit-wait), chunk "
                                  "(a chunked call: prefill and decode together)", ["phase"],
                                  registry=r)
    self.compilations = Counter("cardjax_compilations", "XLA compilations in the server "
                                "process outside its background compile thread (not "
                                "programs loaded from the compilation cache); after the "
                                "warm-up, each one made requests wait", registry=r)
    self.compile_seconds = Counter("cardjax_compile_seconds", "Seconds spent in those "
                                   "compilations", registry=r)
    self.background_compilations = Counter(
        "cardjax_background_compilations", "XLA compilations on the background compile "
        "thread (a learned prompt prefix's programs): no request waits for them", registry=r)
    self._recent: collections.deque = collections.deque()
    self._lock = threading.Lock()
    self._listener = None

  def watch_compilations(self, background: str) -> None:
    """Count every XLA compilation of this process from now on (jax.monitoring), those on
    threads named `background`* counted apart."""
    import jax

    def listener(event: str, seconds: float, **_) -> None:
      if event != COMPILE_EVENT:
        return
      if threading.current_thread().name.startswith(background):
        self.background_compilations.inc()
      else:
        self.compilations.inc()
        self.compile_seconds.inc(seconds)

    self._listener = listener
    jax.monitoring.register_event_duration_secs_listener(listener)

  def unwatch_compilations(self) -> None:
    """Stop counting (a server that stops; tests that build many servers in a process)."""
    import jax

    if self._listener is not None:
      jax.monitoring.unregister_event_duration_listener(self._listener)
      self._listener = None

  def generated(self, tokens: int, row_forwards: int) -> None:
    """One decode chunk's tokens and row-forwards (rows x the chunk's forwards)."""
    now = time.monotonic()
    self.tokens.inc(tokens)
    self.forwards.inc(row_forwards)
    if row_forwards:
      self.tokens_per_forward.set(tokens / row_forwards)
    with self._lock:
      self._recent.append((now, tokens))
      self._rate(now)

  def _rate(self, now: float) -> None:
    while self._recent and self._recent[0][0] < now - WINDOW_S:
      self._recent.popleft()
    self.tokens_per_s.set(sum(n for _, n in self._recent) / WINDOW_S)

  def render(self) -> bytes:
    with self._lock:
      self._rate(time.monotonic())  # decays to 0 when idle
    return generate_latest(self.registry)


def scrape(url: str, timeout: float = 5.0) -> dict[str, float]:
  """Every sample a running server's /metrics shows, by its name with labels as Prometheus
  prints them (`cardjax_requests_total{status="ok"}`): what clients (the load test, the
  tests) read back."""
  with urllib.request.urlopen(url + "/metrics", timeout=timeout) as r:
    text = r.read().decode()
  samples = {}
  for line in text.splitlines():
    if line and not line.startswith("#"):
      name, _, value = line.rpartition(" ")
      samples[name] = float(value)
  return samples
