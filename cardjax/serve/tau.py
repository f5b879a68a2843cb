"""Load-aware MARS tau: accept more tokens per forward when requests queue up.

A lower tau accepts longer runs of drafted tokens, so each request needs fewer forwards
(faster, a little less like AR greedy); a higher one is closer to AR. With a latency
target, the server's tau (used by MARS requests that set none) steps down towards tau_min
while requests wait for a row and recent requests took longer than the target, and steps
back up towards tau_max while nothing waits. Without a target it stays where it started.
"""

from __future__ import annotations

from cardjax.errors import CardjaxError


class TauControl:
  def __init__(self, tau: float, target_ms: float = 0.0, tau_min: float = 0.5,
               tau_max: float = 0.95, step: float = 0.05, smoothing: float = 0.3):
    if target_ms < 0:
      raise CardjaxError(f"--target-latency-ms={target_ms} must be >= 0 (0: fixed tau)")
    if target_ms and not 0.0 <= tau_min <= tau_max <= 1.0:
      raise CardjaxError(f"--tau-min={tau_min} and --tau-max={tau_max} must satisfy "
                         "0 <= tau-min <= tau-max <= 1")
    self.target_s = target_ms / 1000.0
    self.low, self.high, self.step, self.smoothing = tau_min, tau_max, step, smoothing
    self.tau = min(max(tau, tau_min), tau_max) if target_ms else tau
    self.latency_s = 0.0  # moving average of finished requests' latency

  def finished(self, latency_s: float) -> None:
    self.latency_s += self.smoothing * (latency_s - self.latency_s)

  def update(self, waiting: int) -> float:
    """Called between chunks with the requests that found no row; returns the tau."""
    if self.target_s:
      if waiting and self.latency_s > self.target_s:
        self.tau = max(self.low, round(self.tau - self.step, 6))
      elif not waiting:
        self.tau = min(self.high, round(self.tau + self.step, 6))
    return self.tau
