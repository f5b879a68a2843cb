"""The trainer's orbax checkpoints: params, optimizer state, data iterator, configs.

Items of a step: `params` and `model_config` (what cardjax.checkpoint.restore_model and
`cardjax export-hf` read), `opt_state`, `data` (each host's grain iterator state, one file
per process) and `config` (the
run's whole config, for the record). Saves are asynchronous; orbax writes each step to a
temporary folder and renames it only when complete, so a crash, SIGTERM or full disk during
a save leaves the previous step as the latest.
"""

from __future__ import annotations

from pathlib import Path

import jax
import orbax.checkpoint as ocp

from cardjax.checkpoint import manager


class TrainCheckpointer:
  def __init__(self, directory: Path, keep: int, async_save: bool):
    self.directory = Path(directory).absolute()
    self.mngr = manager(self.directory, max_to_keep=keep, async_save=async_save)

  def latest_step(self) -> int | None:
    return self.mngr.latest_step()

  def save(self, step: int, params, opt_state, loader, config, model_cfg) -> None:
    self.mngr.save(step, args=ocp.args.Composite(
        params=ocp.args.StandardSave(params),
        opt_state=ocp.args.StandardSave(opt_state),
        data=loader.checkpoint_save(),
        config=ocp.args.JsonSave(config.to_dict()),
        model_config=ocp.args.JsonSave(model_cfg.to_dict())), force=True)

  def restore(self, step: int, params_target, opt_target, loader):
    """(params, opt_state) of `step`, each array in its target's sharding; `loader` is put
    back where it was. The targets are abstract (ShapeDtypeStructs with shardings): the
    restored arrays are the only ones allocated."""
    # Shape, dtype and sharding only (a compiled function's out_info also carries layouts).
    as_struct = lambda x: jax.ShapeDtypeStruct(x.shape, x.dtype, sharding=x.sharding)
    out = self.mngr.restore(step, args=ocp.args.Composite(
        params=ocp.args.StandardRestore(jax.tree.map(as_struct, params_target)),
        opt_state=ocp.args.StandardRestore(jax.tree.map(as_struct, opt_target)),
        data=loader.checkpoint_restore()))
    return out["params"], out["opt_state"]

  def wait(self) -> None:
    self.mngr.wait_until_finished()

  def close(self) -> None:
    self.mngr.wait_until_finished()
    self.mngr.close()
