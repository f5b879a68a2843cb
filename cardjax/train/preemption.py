"""SIGTERM stops a run cleanly: every host saves the same step, then exits 143.

A preemption (a spot VM reclaimed, a TPU maintenance event, Kubernetes evicting a pod,
Slurm's time limit) reaches the hosts of a job as SIGTERM, seldom at the same moment and
sometimes on one host only. A host that acts on its own signal at its own step enters the
checkpoint save while the others run the next step's collectives: a collective mismatch
(gloo) or a hang (NCCL, ICI), and nothing is saved.

A job of several processes therefore uses the preemption sync of JAX's distributed runtime,
the one orbax and MaxText use. `jax.distributed.initialize` puts a SIGTERM notifier in every
process; a notice on any host reaches the coordination service, which tells the others; each
reports the step it is at and all agree on the one after the largest
(`multihost_utils.reached_preemption_sync_point`, called once per step by every host). Why
this rather than a flag all-reduced inside the step: it costs nothing per step (a local check
until a notice arrives), the compiled step stays as it is, and a signal that arrives while a
host compiles, validates or saves is kept until the next step instead of being lost or
acted on alone.

One process: a Python SIGTERM handler sets a flag and the step just done is saved.

A second SIGTERM during the save changes nothing (the notifier and the handler only record
it); orbax commits a step by a rename once it is complete, so no signal leaves a partial
step as the latest.
"""

from __future__ import annotations

import logging
import signal

import jax

log = logging.getLogger("cardjax.train")


def _sync_manager():
  """JAX's preemption sync manager when this process joined a distributed job with the
  preemption service on; None otherwise."""
  try:
    from jax._src import distributed
  except ImportError:  # a jax without the module: act as one process
    return None
  state = distributed.global_state
  if getattr(state, "client", None) is None:
    return None
  return getattr(state, "preemption_sync_manager", None)


class PreemptionNotice:
  """`reached(step)` is True at the step where this run must save and stop. Used as a
  context manager around the loop (the one-process handler is installed only there)."""

  def __init__(self):
    self.raised = False  # one process: SIGTERM arrived
    self.previous = None
    self.agreed = False  # several processes agree through JAX's runtime

  def __enter__(self):
    self.agreed = _sync_manager() is not None
    if self.agreed:
      # Installing a Python handler would replace the runtime's notifier.
      return self
    if jax.process_count() > 1:
      log.warning("the JAX preemption service is off (jax_enable_preemption_service): each "
                  "host acts on its own SIGTERM, which can leave a job without a checkpoint")
    try:
      self.previous = signal.signal(signal.SIGTERM, self._handle)
    except ValueError:  # not the main thread: no handler, no flag
      self.previous = None
    return self

  def _handle(self, *_):
    self.raised = True

  def reached(self, step: int) -> bool:
    """Called once per step, on every host, with the same step numbers."""
    if self.agreed:
      from jax.experimental import multihost_utils
      return multihost_utils.reached_preemption_sync_point(step)
    return self.raised

  def __exit__(self, *exc):
    if self.previous is not None:
      signal.signal(signal.SIGTERM, self.previous)
