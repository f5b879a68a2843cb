"""What the train loop does between steps: a short list of actions, run in list order after
every step. Each has `due(step)` and `run(job, step)`, where `step` is the number of steps
done (the step of metrics.jsonl lines and checkpoints) and `job` the run that
cardjax/train/loop.py set up.

In list order: the NaN check, the progress bar, the profiles (a window's end, an on-demand
request agreed), a metrics line, validation, a checkpoint, a stop on preemption. Where the
time goes (data, the device, the host; checkpoints and validations) is counted in the
job's StepTimes (cardjax/train/timing.py).
"""

from __future__ import annotations

import contextlib
import logging
import math
import time
from typing import Protocol

import jax

from cardjax.errors import CardjaxError
from cardjax.train import validation

log = logging.getLogger("cardjax.train")


class TrainingError(CardjaxError):
  """The run cannot go on (a NaN loss); the message says which checkpoint is good."""


class Preempted(Exception):
  """SIGTERM arrived; a checkpoint of the current step was written."""


class Action(Protocol):
  def due(self, step: int) -> bool: ...

  def run(self, job, step: int) -> None: ...


def every(n: int, step: int, last: int) -> bool:
  """Every n steps (never for n = 0) and at the run's last step."""
  return (n > 0 and step % n == 0) or step == last


class FiniteLoss:
  """The NaN stop. A step's loss is read (a wait on the device) only after the next step is
  dispatched, so checking never stalls the device; `now()` checks the newest step's loss
  at once, for the actions that must not record a bad step (a metrics line, a save)."""

  def __init__(self, ckpt, times=None):
    self.ckpt = ckpt
    self.times = times  # the job's StepTimes: the wait for the loss is the device's
    self.pending = None  # (step, metrics on the device, objective) of the newest step

  def due(self, step: int) -> bool:
    return True

  def run(self, job, step: int) -> None:
    if self.pending is not None:
      self._check(*self.pending)
    self.pending = (step, job.metrics, job.objective)

  def now(self) -> None:
    self._check(*self.pending)

  def _check(self, step: int, metrics: dict, objective=None) -> None:
    with (self.times.adding("device_wait") if self.times else contextlib.nullcontext()):
      value = float(metrics["loss"])
    if not math.isfinite(value):
      good = self.ckpt.latest_step()
      # An objective that makes a loss NaN on purpose (MARS's compact stream, a row that
      # does not fit) says why; anything else gets the usual suspects.
      hint = objective.nonfinite_hint(metrics) if objective is not None else None
      cause, fix = hint or (None, "lower train.lr, raise train.warmup_steps or check the data")
      raise TrainingError(f"loss became {value} at step {step}"
                          f"{': ' + cause if cause else ''}; stopped. The last good "
                          f"checkpoint is step {good} in {self.ckpt.directory} ({fix})")


class Progress:
  """The progress bar moves every step; Log writes its figures."""

  def __init__(self, bar):
    self.bar = bar

  def due(self, step: int) -> bool:
    return True

  def run(self, job, step: int) -> None:
    self.bar.update(1)


class Clock:
  """Training steps per second between metrics lines (validation time left out)."""

  def __init__(self, step: int):
    self.time, self.step = time.perf_counter(), step

  def lap(self, step: int) -> tuple[int, float]:
    """(steps, seconds) since the last call, which starts the next interval."""
    now = time.perf_counter()
    lap = (step - self.step, now - self.time)
    self.time, self.step = now, step
    return lap

  def restart(self) -> None:
    self.time = time.perf_counter()


class Log:
  """A metrics line (metrics.jsonl, TensorBoard, trackers) every train.log_every steps and at
  the end: the step's metrics, tokens/s, the learning rate it used, MFU, where the time per
  step went (cardjax/train/timing.py) and goodput so far (cardjax/train/goodput.py)."""

  def __init__(self, every: int, last: int, finite: FiniteLoss, clock: Clock, bar):
    self.every, self.last_step = every, last
    self.finite, self.clock, self.bar = finite, clock, bar
    self.values: dict = {}  # the newest line's

  def due(self, step: int) -> bool:
    return every(self.every, step, self.last_step)

  def run(self, job, step: int) -> None:
    self.finite.now()
    with job.times.adding("device_wait"):
      values = {k: float(v) for k, v in jax.device_get(job.metrics).items()}
    steps, seconds = self.clock.lap(step)
    steps_s = steps / max(seconds, 1e-9)
    values["tokens_per_s"] = steps_s * job.model_tokens
    values["lr"] = float(job.schedule(step - 1))  # the rate this step used
    if job.peak:
      values["mfu"] = steps_s * job.flops_per_step / (job.peak * jax.device_count())
    values.update(job.times.line(steps, seconds))
    if job.times.ledger is not None:  # process 0: written before the line asks for an upload
      values["goodput"] = job.times.ledger.goodput(time.time())
      job.times.ledger.save()
    job.writer.write(step, values)
    self.bar.set_postfix(loss=f"{values['loss']:.3f}", tok_s=f"{values['tokens_per_s']:,.0f}",
                         **({"mfu": f"{values['mfu']:.1%}"} if "mfu" in values else {}))
    self.values = values


class Validate:
  """Validation every train.eval_every steps and at the end (eval_every 0: only then)."""

  def __init__(self, every: int, last: int, log_every: int, clock: Clock):
    self.every, self.last_step, self.log_every, self.clock = every, last, log_every, clock
    self.values: dict = {}  # the newest validation's

  def due(self, step: int) -> bool:
    return every(self.every, step, self.last_step)

  def run(self, job, step: int) -> None:
    with job.times.adding("aside"):  # not step time (goodput)
      self.values = validation.evaluate(job.eval_fn, job.params, job.eval_batches, job.mesh,
                                        job.frozen)
    job.writer.write(step, self.values, prefix="eval")
    log.info("step %d eval: %s", step, {k: round(v, 4) for k, v in self.values.items()})
    if step % self.log_every == 0:  # validation time is not training throughput
      self.clock.restart()


class Save:
  """A checkpoint every train.checkpoint_every steps and at the end; never of a NaN step."""

  def __init__(self, every: int, last: int, finite: FiniteLoss):
    self.every, self.last_step, self.finite = every, last, finite

  def due(self, step: int) -> bool:
    return every(self.every, step, self.last_step)

  def run(self, job, step: int) -> None:
    self.finite.now()
    with job.times.adding("aside"):  # not step time (goodput)
      job.save(step)


class StopOnPreemption:
  """After SIGTERM (on any host: cardjax/train/preemption.py agrees the step): the step just
  done is saved, if it is not yet, and the run stops."""

  def __init__(self, notice, finite: FiniteLoss):
    self.notice, self.finite = notice, finite

  def due(self, step: int) -> bool:
    return self.notice.reached(step)

  def run(self, job, step: int) -> None:
    self.finite.now()
    if job.last_saved != step:
      job.save(step)
    job.ckpt.wait()
    hosts = "every host" if jax.process_count() > 1 else "this process"
    raise Preempted(f"preempted (SIGTERM): {hosts} saved step {step} in "
                    f"{job.ckpt.directory}; run the same command again to resume")
