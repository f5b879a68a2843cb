"""Several training lengths for the price of about one: warmup-stable-decay runs that share
their trunk.

A WSD run of S steps warms up, holds its peak rate, and decays linearly to its floor over the
last f * S steps. Up to step (1 - f) * S it is the same computation for every S (same init,
same data order, same corruption keys: all are functions of the seed and the step), so the
run of each length S is the shared constant-rate trunk up to (1 - f) * S followed by its own
decay. Training the trunk once to (1 - f) * S_max and forking a decay from it at every
(1 - f) * S gives every listed length as if it had been its own run, for
(1 - f) * S_max + f * sum(S) steps instead of sum(S).

That is the experiment a data-limited user runs: for each epoch count, a full schedule that
ends there. Validation along one long cosine would instead score the early epoch counts at a
high rate, mid-schedule, which is not what training that many epochs gives anyone.

The rows live in memory (a capped training split is small); epoch e visits them in the
seed's e-th permutation. The step is cardjax's own jitted train step (corruption, forward,
backward, AdamW with clipping and the trainer's weight-decay mask); only the rate is set per
step (optax.inject_hyperparams) so a fork's decay needs no second compile.
"""

from __future__ import annotations

import dataclasses
from typing import Callable

import jax
import jax.numpy as jnp
import numpy as np
import optax
from flax import nnx

from cardjax.config import model_config
from cardjax.model import create_model
from cardjax.objectives import make_objective
from cardjax.train.optimizer import decay_mask
from cardjax.train.step import make_train_step

KEYS = ("tokens", "positions", "segment_ids", "loss_mask")


@dataclasses.dataclass(frozen=True)
class Schedule:
  """The shared schedule: linear warmup to `peak`, then hold; a run of S steps decays
  linearly from step S - round(fraction * S) to `peak * floor_ratio` at step S."""
  peak: float
  warmup: int
  fraction: float
  floor_ratio: float = 0.0

  def decay_steps(self, length: int) -> int:
    return max(1, int(round(self.fraction * length)))

  def fork_at(self, length: int) -> int:
    return length - self.decay_steps(length)

  def rate(self, step: int, length: int) -> float:
    """The rate of step `step` (0-based) of the run of `length` steps: the trainer's wsd
    schedule (cardjax.train.optimizer.learning_rate) at that step."""
    if step < self.warmup:
      return self.peak * step / self.warmup
    start = self.fork_at(length)
    if step < start:
      return self.peak
    done = (step - start) / self.decay_steps(length)
    return self.peak * (1 - done * (1 - self.floor_ratio))

  def check(self, lengths) -> None:
    short = min(lengths)
    if self.fork_at(short) < self.warmup:
      raise ValueError(
          f"the shortest run ({short} steps) starts its decay at step {self.fork_at(short)}, "
          f"inside the {self.warmup}-step warmup; use fewer warmup steps or longer runs")


class Rows:
  """Training rows held in memory, served in a fresh seeded permutation every epoch."""

  def __init__(self, arrays: dict, batch: int, seed: int):
    self.arrays = {k: np.asarray(arrays[k]) for k in KEYS}
    self.count = len(self.arrays["tokens"])
    if self.count < batch:
      raise ValueError(f"{self.count} training rows cannot fill one batch of {batch}")
    self.batch, self.seed = batch, seed
    self.steps_per_epoch = self.count // batch  # the remainder waits for the next epoch's
    self._order: dict[int, np.ndarray] = {}

  def tokens(self) -> int:
    return int((self.arrays["segment_ids"] > 0).sum())

  def at(self, step: int) -> dict:
    epoch, index = divmod(step, self.steps_per_epoch)
    if epoch not in self._order:
      self._order = {epoch: np.random.default_rng([self.seed, epoch]).permutation(self.count)}
    picked = self._order[epoch][index * self.batch:(index + 1) * self.batch]
    return {k: jnp.asarray(v[picked]) for k, v in self.arrays.items()}


def optimizer(train, params) -> optax.GradientTransformation:
  """The trainer's AdamW (clipping, decay mask), its rate a state entry set per step."""
  adamw = optax.inject_hyperparams(optax.adamw, static_args=("mask",))(
      learning_rate=train.lr, b1=train.b1, b2=train.b2, eps=train.eps,
      weight_decay=train.weight_decay, mask=decay_mask(params))
  clip = optax.clip_by_global_norm(train.grad_clip) if train.grad_clip > 0 else optax.identity()
  return optax.chain(clip, adamw)


def with_rate(opt_state, rate: float):
  clip, inner = opt_state
  hyper = dict(inner.hyperparams, learning_rate=jnp.asarray(rate, jnp.float32))
  return clip, inner._replace(hyperparams=hyper)


class Model:
  """One objective's model, optimizer state, jitted train step and validation NLL."""

  def __init__(self, config):
    cfg = model_config(config)
    model = create_model(cfg, seed=config.seed)
    self.graphdef, params = nnx.split(model, nnx.Param)
    self.params = nnx.to_pure_dict(params)
    self.objective = make_objective(config.objective, cfg)
    tx = optimizer(config.train, self.params)
    self.opt_state = tx.init(self.params)
    self.step = jax.jit(make_train_step(self.graphdef, self.objective, tx, config.seed, 1),
                        donate_argnums=(0, 1))
    graphdef, objective = self.graphdef, self.objective

    def nll(params, batch):
      model = nnx.merge(graphdef, params)
      return objective.ar_nll(lambda t, p, s: model(t, positions=p, segment_ids=s), batch)

    self._nll = jax.jit(nll)

  def train(self, params, opt_state, batch: dict, step: int, rate: float):
    params, opt_state, metrics = self.step(params, with_rate(opt_state, rate), batch,
                                           jnp.int32(step))
    return params, opt_state, metrics

  def validation_nll(self, params, batches) -> float:
    """Mean AR-order NLL over the fixed validation batches (the trainer's reading)."""
    return float(np.mean([float(self._nll(params, b)) for b in batches]))


def _copy(tree):
  return jax.tree.map(jnp.copy, tree)


def train_lengths(model: Model, rows: Rows, lengths, schedule: Schedule, batches,
                  on_result: Callable[[int, float], None] | None = None,
                  progress: Callable[[int, int], None] | None = None) -> dict[int, float]:
  """{length: validation NLL of the WSD run of that many steps}, every length from one
  trunk. on_result(length, nll) sees each as it lands; progress(done, total) the steps."""
  lengths = sorted(set(int(n) for n in lengths))
  schedule.check(lengths)
  forks: dict[int, list[int]] = {}
  for n in lengths:
    forks.setdefault(schedule.fork_at(n), []).append(n)
  end = schedule.fork_at(lengths[-1])
  total = end + sum(schedule.decay_steps(n) for n in lengths)
  done, results = 0, {}

  def tick():
    nonlocal done
    done += 1
    if progress and (done % 50 == 0 or done == total):
      progress(done, total)

  params, opt_state = model.params, model.opt_state
  for step in range(end + 1):
    for length in forks.get(step, ()):
      last = length == lengths[-1]
      # the longest run's decay continues the trunk itself; the others train on copies
      p, s = (params, opt_state) if last else (_copy(params), _copy(opt_state))
      for k in range(step, length):
        p, s, _ = model.train(p, s, rows.at(k), k, schedule.rate(k, length))
        tick()
      results[length] = model.validation_nll(p, batches)
      if on_result:
        on_result(length, results[length])
    if step == end:
      break
    params, opt_state, _ = model.train(params, opt_state, rows.at(step), step,
                                       schedule.rate(step, lengths[-1]))
    tick()
  return results
