"""The trainer's orbax checkpoints: params, optimizer state, data iterator, configs.

Items of a step: `params` and `model_config` (what cardjax.checkpoint.restore_model and
`cardjax export-hf` read), `opt_state`, `data` (each host's grain iterator state, one file
per process) and `config` (the run's whole config, for the record). A LoRA run's `params`
are its adapters, and its `lora` item (JSON) holds their spec and the base's path.

Saves are asynchronous; orbax writes each step to a temporary folder and renames it only
when complete, so a crash, SIGTERM or full disk during a save leaves the previous step as
the latest. On s3:// orbax writes to a local staging folder (the step waits for that) and
each step is then uploaded by a background thread, its commit marker last
(cardjax/storage/staged.py); the next save, a stop and the end of the run wait for it.

Which steps are kept (`retention`): the newest step always; the newest `keep` of the
regular saves (steps that are multiples of train.checkpoint_every); every multiple of
train.keep_every, for good. A save at any other step (time-based, at preemption, the end
of a run whose length is no multiple) is kept until a newer step exists.
"""

from __future__ import annotations

import threading
from pathlib import Path

import jax
import orbax.checkpoint as ocp
from orbax.checkpoint import checkpoint_managers as policies

from cardjax.checkpoint import manager
from cardjax.errors import CheckpointError
from cardjax.storage import as_path, resolve, scheme
from cardjax.storage.staged import StagedCheckpoints


def _barrier(name: str) -> None:
  if jax.process_count() > 1:
    from jax.experimental import multihost_utils
    multihost_utils.sync_global_devices(name)


def retention(every: int, keep: int, keep_every: int = 0):
  """The orbax preservation policy of a training run (see the module docstring)."""
  kept = [policies.LatestN(n=1)]
  if every > 0:
    kept.append(policies.EveryNSteps(interval_steps=every, max_to_keep=keep or None))
  if keep_every > 0:
    kept.append(policies.EveryNSteps(interval_steps=keep_every))
  return policies.AnyPreservationPolicy(policies=kept)


class TrainCheckpointer:
  def __init__(self, directory: str | Path, keep: int, async_save: bool, every: int = 0,
               keep_every: int = 0):
    self.directory = resolve(directory)  # where the steps are kept: local or a bucket URI
    self.keep = keep
    self.policy = retention(every, keep, keep_every)
    self.upload: threading.Thread | None = None  # s3: the step being uploaded
    self.upload_error: BaseException | None = None
    self.staged = StagedCheckpoints(self.directory) if scheme(self.directory) == "s3" else None
    self.orbax_dir = self.directory  # what orbax reads and writes
    if self.staged is not None:
      if jax.process_index() == 0:  # the newest committed step, into the staging folder
        self.staged.pull()
      _barrier("cardjax-staged-pull")
      committed = self.staged.committed()
      if committed and not (self.staged.local / str(max(committed))).is_dir():
        raise CheckpointError(
            f"{self.directory}: process {jax.process_index()} does not see step "
            f"{max(committed)} that process 0 downloaded to {self.staged.local}; on s3:// "
            "the hosts of a job must share the staging folder: set CARDJAX_STAGING_DIR to a "
            "shared file system (docs/storage.md)")
      self.orbax_dir = str(self.staged.local)
      async_save = False
    self.async_save = async_save
    self.mngr = manager(self.orbax_dir, async_save=async_save, preservation=self.policy)

  def latest_step(self) -> int | None:
    return self.mngr.latest_step()

  def steps(self) -> list[int]:
    return sorted(self.mngr.all_steps())

  def data_shards(self, step: int) -> int | None:
    """How many data shards `step`'s data item holds state for (None: no data item)."""
    from cardjax.data.shards import saved_count

    folder = as_path(self.orbax_dir) / str(step) / "data"
    return saved_count([p.name for p in folder.iterdir()]) if folder.is_dir() else None

  def set_aside(self, after: int) -> str:
    """Move the steps newer than `after` into WORKDIR/checkpoints_set_aside/ (a resumed
    run's next saves would meet them; they are kept, not deleted, for the user to look
    into). Returns that folder."""
    if self.staged is not None:
      raise CheckpointError(f"{self.directory}: resuming an s3:// run from an older step "
                            "needs its newer steps removed first; delete them from the "
                            "bucket, then run again")
    aside = as_path(self.directory).parent / "checkpoints_set_aside"
    if jax.process_index() == 0:
      aside.mkdir(parents=True, exist_ok=True)
      for step in self.steps():
        if step > after:
          (as_path(self.orbax_dir) / str(step)).rename(aside / str(step))
    _barrier("cardjax-set-aside")
    self.mngr.close()  # it listed the moved steps: a fresh one reads the folder again
    self.mngr = manager(self.orbax_dir, async_save=self.async_save, preservation=self.policy)
    return str(aside)

  def save(self, step: int, params, opt_state, loader, config, model_cfg,
           lora: dict | None = None) -> None:
    """lora: a LoRA run's spec and base path; its params are the adapters only."""
    items = dict(params=ocp.args.StandardSave(params),
                 opt_state=ocp.args.StandardSave(opt_state),
                 data=loader.checkpoint_save(),
                 config=ocp.args.JsonSave(config.to_dict()),
                 model_config=ocp.args.JsonSave(model_cfg.to_dict()))
    if lora is not None:
      items["lora"] = ocp.args.JsonSave(lora)
    self.wait_upload()  # one upload at a time, in step order
    self.mngr.save(step, args=ocp.args.Composite(**items), force=True)
    if self.staged is not None:
      self.mngr.wait_until_finished()  # the step is whole in the staging folder
      if jax.process_index() == 0:
        kept = set(self.steps())  # the bucket keeps what the retention left here
        self.upload = threading.Thread(target=self._push, args=(step, kept),
                                       name=f"cardjax-upload-{step}", daemon=True)
        self.upload.start()

  def _push(self, step: int, kept: set[int]) -> None:
    try:
      self.staged.push(step, kept=kept)
    except BaseException as e:  # raised in the training thread by wait_upload
      self.upload_error = e

  def wait_upload(self) -> None:
    """Until the step being uploaded to s3:// is committed there; its error, if any."""
    if self.upload is not None:
      self.upload.join()
      self.upload = None
    if self.upload_error is not None:
      error, self.upload_error = self.upload_error, None
      raise error

  def restore(self, step: int, params_target, opt_target, loader):
    """(params, opt_state) of `step`, each array in its target's sharding; `loader` is put
    back where it was. The targets are abstract (ShapeDtypeStructs with shardings): the
    restored arrays are the only ones allocated."""
    # Shape, dtype and sharding only (a compiled function's out_info also carries layouts).
    as_struct = lambda x: jax.ShapeDtypeStruct(x.shape, x.dtype, sharding=x.sharding)
    items = {"params": ocp.args.StandardRestore(jax.tree.map(as_struct, params_target)),
             "opt_state": ocp.args.StandardRestore(jax.tree.map(as_struct, opt_target)),
             "data": loader.checkpoint_restore()}
    out = {}
    for name, args in items.items():  # one at a time, so a failure names its part
      try:
        out[name] = self.mngr.restore(step, args=ocp.args.Composite(**{name: args}))[name]
      except Exception as e:  # orbax and TensorStore raise many kinds: one clear error
        raise self.unreadable(step, name, e) from e
    return out["params"], out["opt_state"]

  def unreadable(self, step: int, part: str, error: Exception) -> CheckpointError:
    """The error for a step whose `part` (params, opt_state, data, model_config) cannot be
    read: what failed, and the way on."""
    first = (str(error).strip().splitlines() or [type(error).__name__])[0][:200]
    older = [s for s in self.steps() if s < step]
    way = (f"resume from an older step with --config.train.resume_step={older[-1]} (this "
           f"run has {older}; the newer steps are set aside, not deleted)" if older else
           f"it is the run's only checkpoint: delete {self.directory}/{step} to start the run "
           "afresh")
    return CheckpointError(f"checkpoint step {step} in {self.directory} cannot be read: its "
                           f"{part} failed ({type(error).__name__}: {first}); {way}")

  def wait(self) -> None:
    self.mngr.wait_until_finished()
    self.wait_upload()

  def close(self) -> None:
    self.mngr.wait_until_finished()
    self.wait_upload()
    self.mngr.close()
