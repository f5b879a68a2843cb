"""`cardjax train`: the training loop around the jitted step.

`setup` builds the run: resume from the newest checkpoint in WORKDIR/checkpoints if there is
one, else initialise from train.init_from (a HF folder, an orbax checkpoint) or at random;
one jit of the step with explicit shardings and donation; the data, the validation batches,
the metrics writer. `_loop` then runs one step at a time and after each the periodic actions
of cardjax/train/periodic.py: the NaN check (one step late, so it never stalls the device),
the progress bar (loss, tokens/s, MFU, ETA), metrics to WORKDIR/metrics.jsonl,
TensorBoard and the trackers of train.trackers (each line with where the step's time went
and the goodput so far, WORKDIR/goodput.json; a bucket workdir's uploaded while the run
goes), validation, checkpoints (with the data iterator) every train.checkpoint_every
steps and at the end, and a save and stop on SIGTERM (every host the same step,
cardjax/train/preemption.py). A stall watchdog ends a run whose steps stop
(cardjax/train/watchdog.py); CARDJAX_FAULTS makes faults on purpose (faults.py). A NaN or
infinite loss stops the run with the last good checkpoint left as the latest.
`--profile-steps A:B` traces steps A to B (cardjax/train/profile.py); WORKDIR/PROFILE or
SIGUSR1 traces the next steps on every host (cardjax/train/profile_demand.py). WORKDIR may
be a bucket URI (docs/storage.md).
"""

from __future__ import annotations

import contextlib
import dataclasses
import logging
import time
from pathlib import Path
from typing import Any, Callable

import jax
import jax.numpy as jnp
import numpy as np
from flax import nnx
from tqdm import tqdm

from cardjax import checkpoint as model_checkpoint
from cardjax.config import model_config
from cardjax.data.pipeline import batch_sharding
from cardjax.data.shards import hosts_for
from cardjax.data.prepare import make_loader, tokenizer_source
from cardjax.errors import CardjaxError, CheckpointError
from cardjax.model import ModelConfig, abstract_model, cast_params, create_model
from cardjax.model import adapters as lora_adapters
from cardjax.model.lora import count as param_total, nbytes
from cardjax.model.lora_spec import spec_from_config
from cardjax.objectives import make_objective
from cardjax.parallel import make_mesh, use_rules
from cardjax.train import flops, goodput, periodic, profile_demand, trackers, validation
from cardjax.train.checkpointing import TrainCheckpointer
from cardjax.storage import checked_path, check, is_remote, resolve
from cardjax.train.metrics import MetricsWriter, local_run_dir
from cardjax.train.optimizer import learning_rate, make_optimizer, sharded_init
from cardjax.train.periodic import Preempted, TrainingError
from cardjax.train.faults import Faults
from cardjax.train.preemption import PreemptionNotice
from cardjax.train.profile import ProfileWindow, parse_steps
from cardjax.train.step import jit_train_step, make_eval_step
from cardjax.train.timed_save import TimedSave
from cardjax.train.timing import StepTimes
from cardjax.train.watchdog import StallWatchdog, exit_delay

__all__ = ["train", "setup", "Job", "TrainingError", "Preempted"]

log = logging.getLogger("cardjax.train")
RUNTIME_FIELDS = ("dtype", "param_dtype", "scan_layers", "remat", "attention_impl",
                  "mask_token_id")


def train(config, workdir: str | Path) -> dict:
  """Run (or resume) the training job; returns the last train and eval metrics."""
  started = time.time()  # this attempt's start, for goodput
  workdir = resolve(workdir)
  # A bad value, an unreachable bucket, missing credentials, a tracker's missing package:
  # each fails before any work.
  profile_steps = parse_steps(config.train.profile_steps, config.train.steps)
  trackers.check(config.train.trackers)
  for path in (workdir, config.train.init_from, config.train.lora.init_from):
    if path:
      check(path)
  if not is_remote(workdir):
    Path(workdir).mkdir(parents=True, exist_ok=True)
  if config.train.compilation_cache_dir:
    # Before the first compile; entries are keyed by program, devices and jax version.
    jax.config.update("jax_compilation_cache_dir", config.train.compilation_cache_dir)
    jax.config.update("jax_persistent_cache_min_compile_time_secs", 1.0)
  mesh = make_mesh(config.mesh.data, config.mesh.fsdp, config.mesh.tensor,
                   slices=config.mesh.slices)
  rules = config.mesh.rules or None
  # SIGUSR1 asks for a profile from now on (its default action would end the process).
  requests = profile_demand.Requests(workdir, config.train.profile_on_demand_steps > 0)
  try:
    with jax.set_mesh(mesh), (use_rules(rules) if rules else contextlib.nullcontext()):
      job = setup(config, workdir, mesh)
      try:
        _watch(job, config, workdir, started)
      except BaseException:  # a tracker that cannot start: the run's files closed first
        job.close()
        raise
      profile = ProfileWindow(profile_steps, local_run_dir(workdir) / "profile", job.start)
      profile = profile_demand.Profiles(
          profile, requests, config.train.profile_on_demand_steps, config.train.log_every,
          config.train.steps, local_run_dir(workdir) / "profile", workdir)
      return _loop(job, profile)
  finally:
    requests.close()


def _watch(job, config, workdir: str, started: float) -> None:
  """What a person watching the run sees beyond metrics.jsonl: uploads of a bucket
  workdir's files while it runs, the goodput ledger and the trackers (process 0)."""
  job.writer.sync_every = config.train.metrics_sync_seconds
  if not job.writer.enabled:
    return
  ledger = goodput.Ledger.open(job.writer.local)
  ledger.begin(job.start, started, goodput.attempt_from_env())
  job.times.ledger = ledger

  def finish():  # on the terminal, as the resume line is, not twice through the log
    print(ledger.close(time.time()), flush=True)

  job.writer.closing.append(finish)
  job.writer.trackers = trackers.make(config, job.writer.local, workdir)


@dataclasses.dataclass
class Job:
  """A run as `setup` builds it: the state each step replaces (params, opt_state, metrics)
  and what the step and the periodic actions read."""
  config: Any
  mesh: Any
  cfg: ModelConfig
  objective: Any
  ckpt: TrainCheckpointer
  loader: Any
  writer: MetricsWriter
  step_fn: Callable
  eval_fn: Callable
  eval_batches: list
  schedule: Callable
  params: Any  # what the optimizer trains: every weight, or the LoRA adapters only
  opt_state: Any
  start: int  # steps done before this run (the resumed checkpoint's step)
  last_saved: int | None  # the step of the newest checkpoint
  model_tokens: int  # tokens the model reads per step (MARS: twice the data's)
  peak: float | None  # one device's peak FLOP/s, where known
  flops_per_step: float | None = None  # measured on the first batch
  metrics: dict = dataclasses.field(default_factory=dict)  # the newest step's, on device
  times: StepTimes = dataclasses.field(default_factory=StepTimes)  # where the time goes
  frozen: Any = dataclasses.field(default_factory=dict)  # LoRA's base weights; {} otherwise
  lora: Any = None  # the LoraSpec of a LoRA run

  def advance(self, step: int) -> None:
    """Runs step `step` (counted from 1, as metrics.jsonl counts): dispatched, not waited
    for."""
    with self.times.adding("data_wait"):
      batch = next(self.loader)
    if self.flops_per_step is None:
      # This host's rows (a global array is not fully addressable on a pod).
      local = {k: np.asarray(v.addressable_shards[0].data) for k, v in batch.items()}
      self.flops_per_step = flops.train_flops_per_step(self.cfg, self.objective, local,
                                                       self.config.data.batch_size,
                                                       frozen_base=self.lora is not None)
    # The step function counts from 0: its corruption keys and its learning rate.
    self.params, self.opt_state, self.metrics = self.step_fn(
        self.params, self.opt_state, batch, jnp.int32(step - 1), self.frozen)

  def save(self, step: int) -> None:
    lora = None
    if self.lora is not None:  # where restore_model finds the base the adapters fit
      lora = dict(self.lora.to_dict(), base=resolve(self.config.train.init_from))
    self.ckpt.save(step, self.params, self.opt_state, self.loader, self.config, self.cfg,
                   lora)
    self.last_saved = step
    self.writer.sync()  # a bucket workdir's metrics, as far as the checkpoint

  def close(self) -> None:
    self.writer.close()
    self.loader.close()
    self.ckpt.close()


def _init_model(config, mesh):
  """(model, source) from train.init_from or a random init."""
  source = config.train.init_from
  runtime = {k: config.model[k] for k in RUNTIME_FIELDS}
  if not source:
    return create_model(model_config(config), seed=config.seed, mesh=mesh), "random init"
  if not (checked_path(resolve(source)) / "config.json").is_file():
    # A checkpoint keeps its own layout (scan_layers, param_dtype); HF folders take all.
    runtime = {k: runtime[k] for k in ("dtype", "remat", "attention_impl", "mask_token_id")}
  try:
    return model_checkpoint.load_model(source, mesh=mesh, **runtime)
  except CheckpointError as e:
    raise CardjaxError(f"train.init_from={source!r}: {e}") from None


def _peft_adapters(source: str, cfg, spec, mesh) -> dict:
  """The adapters of the PEFT folder train.lora.init_from names, checked against the
  config's spec and the base's shapes, in their shardings on `mesh`."""
  from cardjax.hf.peft import read_adapter
  from cardjax.storage.transfer import cached_copy

  try:
    values = read_adapter(cached_copy(source), cfg, spec)
  except CheckpointError as e:
    raise CardjaxError(f"train.lora.init_from={source!r}: {e}") from None
  return lora_adapters.place(cfg, spec, values, mesh)


def setup(config, workdir: str | Path, mesh) -> Job:
  """The model (resumed, loaded or new), optimizer, data, checkpointer, jitted steps and
  metrics writer of a run, inside `mesh` (and its sharding rules)."""
  t = config.train
  workdir = resolve(workdir)
  ckpt = TrainCheckpointer(f"{workdir}/checkpoints", t.keep_checkpoints, t.async_checkpoint,
                           every=t.checkpoint_every, keep_every=t.keep_every)
  # The tokenizer travels with the checkpoints: export-hf then writes a complete HF folder
  # and generate needs no data dir.
  model_checkpoint.copy_assets(ckpt.directory, tokenizer_source(config))
  latest = _resume_step(ckpt, t.resume_step)
  spec = spec_from_config(t.lora)
  if spec is not None:
    # LoRA: the base always comes from train.init_from (checkpoints hold adapters only);
    # fresh adapters, which a resumed run's restore below replaces.
    base, origin = _init_model(config, mesh)
    if t.lora.base_dtype:
      base = cast_params(base, t.lora.base_dtype)
    start_from = None
    if t.lora.init_from and latest is None:  # a resumed run restores its own adapters
      start_from = _peft_adapters(t.lora.init_from, base.cfg, spec, mesh)
    model = lora_adapters.attach(base, spec, seed=config.seed, mesh=mesh, adapters=start_from)
    origin = f"LoRA rank {spec.rank} on {','.join(spec.targets)} over {origin}"
    if start_from is not None:
      origin += f", adapters from PEFT {t.lora.init_from}"
    if latest is not None:
      origin += f", resumed from step {latest}"
  elif latest is not None:
    try:
      saved = model_checkpoint.read_model_config(ckpt.orbax_dir, latest)
    except CheckpointError:
      raise
    except Exception as e:  # a damaged JSON item: the same clear error as the arrays'
      raise ckpt.unreadable(latest, "model_config", e) from e
    runtime = {k: config.model[k] for k in RUNTIME_FIELDS}
    # Shapes and shardings only: the restore below writes every array once, so a resumed
    # run never holds a random init next to the checkpoint.
    model = abstract_model(ModelConfig.from_dict({**saved.to_dict(), **runtime}), mesh)
    origin = f"resumed from step {latest}"
  else:
    model, origin = _init_model(config, mesh)
  cfg = model.cfg
  objective = make_objective(config.objective, cfg)
  graphdef, params, frozen = nnx.split(model, nnx.LoRAParam if spec else nnx.Param, nnx.Param)
  params, frozen = nnx.to_pure_dict(params), nnx.to_pure_dict(frozen)
  del model
  tx = make_optimizer(t, params)
  init_opt = sharded_init(tx, params, mesh)
  loader = make_loader(config, mesh=mesh, **_resumed_shards(config, ckpt, latest))
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
  frozen_sh = jax.tree.map(lambda x: x.sharding, frozen)
  log.info("model: %s (%s), objective %s, mesh %s", origin, cfg.model_type, objective.name,
           dict(mesh.shape))
  _log_trainable(params, frozen, opt_state)

  step_fn = jit_train_step(graphdef, objective, tx, t, config.seed, param_sh, opt_sh,
                           batch_sharding(mesh), frozen_sh)
  eval_fn = jax.jit(make_eval_step(graphdef, objective, config.seed, t.loss_chunk))
  # Read before the first step (and its timer), so a broken validation split fails at once.
  eval_batches = validation.eval_batches(config)
  return Job(config=config, mesh=mesh, cfg=cfg, objective=objective, ckpt=ckpt,
             loader=loader, writer=MetricsWriter(workdir), step_fn=step_fn, eval_fn=eval_fn,
             eval_batches=eval_batches, schedule=learning_rate(t), params=params,
             opt_state=opt_state, start=start, last_saved=latest,
             model_tokens=(config.data.batch_size * config.data.seq_len
                           * objective.stream_factor),
             peak=flops.peak_flops_per_device(), frozen=frozen, lora=spec)


def _resumed_shards(config, ckpt: TrainCheckpointer, latest: int | None) -> dict:
  """A resumed run reads its data in the shards it started with (their states are what
  its checkpoint holds), on however many hosts now run it, if they divide that count."""
  shards = ckpt.data_shards(latest) if latest is not None else None
  if not shards:
    return {}
  if config.data.shards and config.data.shards != shards:
    log.warning("data.shards=%d is ignored: this run reads its data in the %d shards it "
                "started with", config.data.shards, shards)
  if shards % jax.process_count():
    raise CardjaxError(f"this run's data is read in {shards} shards (fixed when it started; "
                       f"its checkpoints hold their states), which {jax.process_count()} hosts "
                       f"cannot share evenly; resume it on {hosts_for(shards)} hosts")
  return {"shards": shards}


def _log_trainable(params, frozen, opt_state) -> None:
  """What the optimizer trains and holds, on the terminal and in the log."""
  trained, held = param_total(params), param_total(frozen)
  line = (f"trainable parameters: {trained:,} of {trained + held:,} "
          f"({100 * trained / (trained + held):.2f}%); optimizer state "
          f"{nbytes(opt_state) / 2**20:,.1f} MiB; frozen weights {nbytes(frozen) / 2**20:,.1f} "
          "MiB")
  log.info(line)
  if jax.process_index() == 0:
    print(line, flush=True)


def _resume_step(ckpt: TrainCheckpointer, wanted: int) -> int | None:
  """The step a run resumes from: the newest (None: a new run), or train.resume_step, with
  the steps after it set aside."""
  latest = ckpt.latest_step()
  if not wanted:
    return latest
  if wanted not in ckpt.steps():
    raise CheckpointError(f"config train.resume_step={wanted}: {ckpt.directory} has steps "
                          f"{ckpt.steps()}; name one of them (0: the newest)")
  if wanted < latest:
    aside = ckpt.set_aside(wanted)
    log.warning("resuming from step %d as train.resume_step asks: steps after it moved to %s",
                wanted, aside)
  return wanted


def _loop(job: Job, profile: profile_demand.Profiles) -> dict:
  """Steps job.start + 1 to train.steps, each followed by the periodic actions due."""
  t = job.config.train
  bar = tqdm(total=t.steps, initial=job.start,
             disable=not t.progress or jax.process_index() != 0,
             desc=f"train {job.objective.name}", unit="step", dynamic_ncols=True)
  clock = periodic.Clock(job.start)
  if job.start and jax.process_index() == 0:  # by default, not only in the INFO log
    print(f"resuming from step {job.start} of {t.steps}", flush=True)
  finite = periodic.FiniteLoss(job.ckpt, job.times)
  log_line = periodic.Log(t.log_every, t.steps, finite, clock, bar)
  validate = periodic.Validate(t.eval_every, t.steps, t.log_every, clock)
  faults = Faults.from_env()
  try:
    watchdog = StallWatchdog(t.stall_timeout, t.stall_first_timeout,
                             exit_delay=exit_delay(jax.process_index(), jax.process_count()))
    with PreemptionNotice() as notice, watchdog:
      actions = [finite, periodic.Progress(bar), profile, log_line, validate,
                 periodic.Save(t.checkpoint_every, t.steps, finite),
                 TimedSave(t.checkpoint_minutes, job.start, finite),
                 periodic.StopOnPreemption(notice, finite)]
      for step in range(job.start + 1, t.steps + 1):  # numbered as metrics.jsonl numbers them
        faults.before(step)
        profile.before(step)
        with jax.profiler.StepTraceAnnotation("train", step_num=step):
          job.advance(step)
        for action in actions:
          if action.due(step):
            action.run(job, step)
        watchdog.beat()  # FiniteLoss waited for the step before: the device moves on
        job.times.step_done(step)  # its time, for goodput
  finally:
    profile.close()
    bar.close()
    job.close()
  return {"train": log_line.values, "eval": validate.values, "step": t.steps,
          "start": job.start}
