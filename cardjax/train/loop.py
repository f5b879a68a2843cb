"""`cardjax train`: the training loop around the jitted step.

Start-up: resume from the newest checkpoint in WORKDIR/checkpoints if there is one, else
initialise from train.init_from (a HF folder, an orbax checkpoint) or at random. Then: one
jit of the step with explicit shardings and donation, a progress bar (loss, tokens/s, MFU,
ETA), metrics to WORKDIR/metrics.jsonl and TensorBoard, validation, checkpoints (with the
data iterator) every train.checkpoint_every steps, at the end, and on SIGTERM. A NaN or
infinite loss stops the run with the last good checkpoint left as the latest.
"""

from __future__ import annotations

import contextlib
import logging
import math
import signal
import time
from pathlib import Path

import jax
import jax.numpy as jnp
import numpy as np
from flax import nnx
from tqdm import tqdm

from cardjax import checkpoint as model_checkpoint
from cardjax import hf
from cardjax.config import model_config
from cardjax.data.pipeline import batch_sharding
from cardjax.data.prepare import make_loader, tokenizer_source
from cardjax.errors import CardjaxError
from cardjax.model import ModelConfig, abstract_model, create_model
from cardjax.objectives import make_objective
from cardjax.parallel import make_mesh, use_rules
from cardjax.train import flops, validation
from cardjax.train.checkpointing import TrainCheckpointer
from cardjax.train.metrics import MetricsWriter
from cardjax.train.optimizer import learning_rate, make_optimizer, sharded_init
from cardjax.train.step import jit_train_step, make_eval_step

log = logging.getLogger("cardjax.train")
RUNTIME_FIELDS = ("dtype", "param_dtype", "scan_layers", "remat", "attention_impl",
                  "mask_token_id")


class TrainingError(CardjaxError):
  """The run cannot go on (a NaN loss); the message says which checkpoint is good."""


class Preempted(Exception):
  """SIGTERM arrived; a checkpoint of the current step was written."""


def _init_model(config, mesh):
  """(model, source) from train.init_from or a random init."""
  source = config.train.init_from
  runtime = {k: config.model[k] for k in RUNTIME_FIELDS}
  if not source:
    return create_model(model_config(config), seed=config.seed, mesh=mesh), "random init"
  path = Path(source)
  if (path / "config.json").is_file():
    return hf.from_pretrained(path, mesh=mesh, **runtime), f"HF {path}"
  if path.is_dir():
    overrides = {k: runtime[k] for k in ("dtype", "remat", "attention_impl", "mask_token_id")}
    model, step = model_checkpoint.restore_model(path, mesh=mesh, **overrides)
    return model, f"orbax {path} step {step}"
  raise CardjaxError(f"train.init_from={source!r} is neither a HF folder (config.json) nor "
                     "an orbax checkpoint folder")


class _SigtermFlag:
  def __init__(self):
    self.raised = False
    self.previous = None

  def __enter__(self):
    try:
      self.previous = signal.signal(signal.SIGTERM, self._handle)
    except ValueError:  # not the main thread: no handler, no flag
      self.previous = None
    return self

  def _handle(self, *_):
    self.raised = True

  def __exit__(self, *exc):
    if self.previous is not None:
      signal.signal(signal.SIGTERM, self.previous)


def train(config, workdir: str | Path) -> dict:
  """Run (or resume) the training job; returns the last train and eval metrics."""
  workdir = Path(workdir).absolute()
  workdir.mkdir(parents=True, exist_ok=True)
  if config.train.compilation_cache_dir:
    # Before the first compile; entries are keyed by program, devices and jax version.
    jax.config.update("jax_compilation_cache_dir", config.train.compilation_cache_dir)
    jax.config.update("jax_persistent_cache_min_compile_time_secs", 1.0)
  mesh = make_mesh(config.mesh.data, config.mesh.fsdp, config.mesh.tensor,
                   slices=config.mesh.slices)
  rules = config.mesh.rules or None
  with jax.set_mesh(mesh), (use_rules(rules) if rules else contextlib.nullcontext()):
    return _train(config, workdir, mesh)


def _train(config, workdir: Path, mesh) -> dict:
  t = config.train
  ckpt = TrainCheckpointer(workdir / "checkpoints", t.keep_checkpoints, t.async_checkpoint)
  # The tokenizer travels with the checkpoints: export-hf then writes a complete HF folder
  # and generate needs no data dir.
  model_checkpoint.copy_assets(ckpt.directory, tokenizer_source(config))
  latest = ckpt.latest_step()
  if latest is not None:
    saved = model_checkpoint.read_model_config(ckpt.directory, latest)
    runtime = {k: config.model[k] for k in RUNTIME_FIELDS}
    # Shapes and shardings only: the restore below writes every array once, so a resumed
    # run never holds a random init next to the checkpoint.
    model = abstract_model(ModelConfig.from_dict({**saved.to_dict(), **runtime}), mesh)
    origin = f"resumed from step {latest}"
  else:
    model, origin = _init_model(config, mesh)
  cfg = model.cfg
  objective = make_objective(config.objective, cfg)
  graphdef, params = nnx.split(model, nnx.Param)
  params = nnx.to_pure_dict(params)
  del model
  tx = make_optimizer(t, params)
  schedule = learning_rate(t)
  init_opt = sharded_init(tx, params, mesh)
  loader = make_loader(config, mesh=mesh)
  if latest is None:
    opt_state, start = init_opt(params), 0
  else:
    # The optimizer state's target is what init_opt returns, compiled but never run, so it
    # has exactly the shardings a fresh run's state has.
    opt_target = init_opt.lower(params).compile().out_info
    params, opt_state = ckpt.restore(latest, params, opt_target, loader)
    start = latest
  param_sh = jax.tree.map(lambda x: x.sharding, params)
  opt_sh = jax.tree.map(lambda x: x.sharding, opt_state)
  log.info("model: %s (%s), objective %s, mesh %s", origin, cfg.model_type, objective.name,
           dict(mesh.shape))

  step_fn = jit_train_step(graphdef, objective, tx, t, config.seed, param_sh, opt_sh,
                           batch_sharding(mesh))
  eval_fn = jax.jit(make_eval_step(graphdef, objective, config.seed, t.loss_chunk))
  # Read before the first step (and its timer), so a broken validation split fails at once.
  eval_batches = validation.eval_batches(config)

  writer = MetricsWriter(workdir)
  rows, seq = config.data.batch_size, config.data.seq_len
  model_tokens = rows * seq * objective.stream_factor
  peak = flops.peak_flops_per_device()
  flops_per_step = None
  metrics: dict = {}
  eval_metrics: dict = {}
  last_saved = start if latest is not None else None
  pending = None  # (step, loss array) of the step before, checked one step late
  bar = tqdm(total=t.steps, initial=start, disable=not t.progress or jax.process_index() != 0,
             desc=f"train {objective.name}", unit="step", dynamic_ncols=True)
  tick, tick_step = time.perf_counter(), start

  def check(step, loss):
    value = float(loss)
    if not math.isfinite(value):
      good = ckpt.latest_step()
      raise TrainingError(f"loss became {value} at step {step}; stopped. The last good "
                          f"checkpoint is step {good} in {ckpt.directory} (lower train.lr, "
                          "raise train.warmup_steps or check the data)")

  def save(step):
    nonlocal last_saved
    ckpt.save(step, params, opt_state, loader, config, cfg)
    last_saved = step

  try:
    with _SigtermFlag() as sigterm:
      for step in range(start, t.steps):
        batch = next(loader)
        if flops_per_step is None:
          # This host's rows (a global array is not fully addressable on a pod).
          local = {k: np.asarray(v.addressable_shards[0].data) for k, v in batch.items()}
          flops_per_step = flops.train_flops_per_step(cfg, objective, local, rows)
        params, opt_state, metrics = step_fn(params, opt_state, batch, jnp.int32(step))
        if pending is not None:
          check(*pending)
        pending = (step + 1, metrics["loss"])
        done = step + 1
        bar.update(1)
        if done % t.log_every == 0 or done == t.steps:
          check(*pending)
          values = {k: float(v) for k, v in jax.device_get(metrics).items()}
          elapsed = time.perf_counter() - tick
          steps_s = (done - tick_step) / max(elapsed, 1e-9)
          values["tokens_per_s"] = steps_s * model_tokens
          values["lr"] = float(schedule(step))  # the rate this step used
          if peak:
            values["mfu"] = steps_s * flops_per_step / (peak * jax.device_count())
          tick, tick_step = time.perf_counter(), done
          writer.write(done, values)
          bar.set_postfix(loss=f"{values['loss']:.3f}", tok_s=f"{values['tokens_per_s']:,.0f}",
                          **({"mfu": f"{values['mfu']:.1%}"} if "mfu" in values else {}))
          metrics = values
        if (t.eval_every and done % t.eval_every == 0) or done == t.steps:
          eval_metrics = validation.evaluate(eval_fn, params, eval_batches, mesh)
          writer.write(done, eval_metrics, prefix="eval")
          log.info("step %d eval: %s", done, {k: round(v, 4) for k, v in eval_metrics.items()})
          if done % t.log_every == 0:  # validation time is not training throughput
            tick = time.perf_counter()
        if done % t.checkpoint_every == 0 or done == t.steps:
          check(*pending)
          save(done)
        if sigterm.raised:
          check(*pending)
          if last_saved != done:
            save(done)
          ckpt.wait()
          raise Preempted(f"SIGTERM: saved step {done} in {ckpt.directory}; run the same "
                          "command again to resume")
  finally:
    bar.close()
    writer.close()
    loader.close()
    ckpt.close()
  return {"train": metrics, "eval": eval_metrics, "step": t.steps}

