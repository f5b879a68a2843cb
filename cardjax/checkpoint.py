"""Orbax checkpoints of a model: `params` (the nnx parameter tree) and `model_config` (JSON).

Layout: DIR/<step>/{params,model_config}/ managed by an orbax CheckpointManager, plus
DIR/hf_assets/ holding the tokenizer files of an imported HF model. Orbax writes each step
to a temporary folder and renames it when complete, so an interrupted save never becomes
the latest step (on gs://, where a rename is not atomic, orbax writes a commit file last).
DIR may be a bucket URI: gs:// is orbax's own (tensorstore's gcs driver); s3:// goes through
a local staging folder (cardjax/storage/staged.py). The trainer adds more items (optimizer
state, data iterator, config) to the same manager; these functions read and write only the
model's two.
"""

from __future__ import annotations

import time
from pathlib import Path

import jax
import orbax.checkpoint as ocp
from flax import nnx

from cardjax import hf
from cardjax.errors import CheckpointError
from cardjax.model.config import ModelConfig
from cardjax.model.create import abstract_model
from cardjax.model.decoder import Decoder
from cardjax.storage import checked_path, resolve, scheme
from cardjax.storage.staged import StagedCheckpoints
from cardjax.storage.transfer import cached_copy, copy_file

ASSETS = "hf_assets"
_REOPENS = 5  # listings of a checkpoints folder a writer keeps pruning


def manager(directory: str | Path, max_to_keep: int | None = None, create: bool = True,
            async_save: bool = False, preservation=None) -> ocp.CheckpointManager:
  """preservation: an orbax preservation policy, instead of max_to_keep (which steps the
  manager keeps when it saves)."""
  options = ocp.CheckpointManagerOptions(max_to_keep=max_to_keep, create=create,
                                         enable_async_checkpointing=async_save,
                                         preservation_policy=preservation)
  if scheme(directory) == "s3":  # orbax cannot write s3:// (see cardjax/storage/staged.py)
    raise ValueError(f"{directory}: open s3:// checkpoints through StagedCheckpoints")
  # Opening lists the steps, then reads each one's metadata. A live run that keeps only its
  # newest steps may delete one in between (a reader watching a training job's bucket): the
  # vanished step is an OSError, and listing again sees the folder as it is now.
  for attempt in range(_REOPENS):
    try:
      return ocp.CheckpointManager(checked_path(directory), options=options)
    except (FileNotFoundError, NotADirectoryError):  # gcsfs's 404; a local step renamed away
      if attempt == _REOPENS - 1:
        raise
      time.sleep(0.05 * (attempt + 1))


def save_model(directory: str | Path, model: Decoder, step: int = 0,
               assets_from: str | Path | None = None, data_loader=None,
               run_config=None) -> str:
  """Save the parameters and model config as `step` (and a DataLoader's iterator state, so a
  resumed run gets exactly the next batches; and the run config, where its tokenizer is
  found); copy tokenizer files once. Returns the folder (local absolute or a bucket URI)."""
  directory = resolve(directory)
  staged = StagedCheckpoints(directory) if scheme(directory) == "s3" else None
  params = nnx.to_pure_dict(nnx.state(model, nnx.Param))
  items = dict(params=ocp.args.StandardSave(params),
               model_config=ocp.args.JsonSave(model.cfg.to_dict()))
  if data_loader is not None:
    items["data"] = data_loader.checkpoint_save()
  if run_config is not None:
    items["config"] = ocp.args.JsonSave(run_config.to_dict())
  with manager(staged.pull() if staged else directory) as mngr:
    mngr.save(step, args=ocp.args.Composite(**items))
    mngr.wait_until_finished()
  if staged is not None:
    staged.push(step)
  if assets_from is not None:
    copy_assets(directory, assets_from)
  return directory


def copy_assets(directory: str | Path, source: str | Path) -> None:
  """Copy the tokenizer files of `source` (a HF or tokenizer folder) into DIR/hf_assets
  (process 0), where `cardjax export-hf` and `cardjax generate` look for them."""
  files = hf.asset_files(source)
  if not files or jax.process_index() != 0:
    return
  target = checked_path(directory) / ASSETS
  target.mkdir(parents=True, exist_ok=True)
  for f in files:
    copy_file(f, target / f.name)


def readable_dir(directory: str | Path, step: int | None = None):
  """The folder orbax reads for `directory`: itself (local or gs://), or for s3:// the
  local staging folder, holding `step` (default: the newest committed step)."""
  text = resolve(directory)
  if scheme(text) == "s3":
    staged = StagedCheckpoints(text)
    if not staged.committed():
      raise CheckpointError(f"{text} holds no committed checkpoint step (is the path right? "
                            "an interrupted upload has no marker and is never read)")
    return staged.pull(step)
  path = checked_path(text)
  if not path.is_dir():
    raise CheckpointError(f"checkpoint directory {text} does not exist")
  return path


def latest_step(directory: str | Path) -> int:
  directory = readable_dir(directory)
  with manager(directory, create=False) as mngr:
    step = mngr.latest_step()
  if step is None:
    raise CheckpointError(f"{directory} holds no complete checkpoint step (an interrupted "
                          "save leaves only a temporary folder, which is never read)")
  return step


def saved_steps(directory: str | Path) -> list[int]:
  """The complete steps saved in a checkpoints folder, oldest first; [] when there is no
  folder or nothing finished saving in it (a run stopped before its first save)."""
  text = resolve(directory)
  if scheme(text) == "s3":
    return sorted(StagedCheckpoints(text).committed())
  directory = checked_path(text)
  if not directory.is_dir():
    return []
  with manager(directory, create=False) as mngr:
    return sorted(mngr.all_steps())


def restore_data_state(directory: str | Path, data_loader, step: int | None = None) -> None:
  """Put `data_loader` (a DataLoader like the saved one) where it was at `step`."""
  directory = readable_dir(directory, step)
  step = latest_step(directory) if step is None else step
  if not (directory / str(step) / "data").exists():
    raise CheckpointError(f"{directory}/{step} holds no data iterator state")
  with manager(directory, create=False) as mngr:
    mngr.restore(step, args=ocp.args.Composite(data=data_loader.checkpoint_restore()))


def read_run_config(directory: str | Path, step: int | None = None):
  """The run config a training checkpoint was saved with, or None (imports have none)."""
  import ml_collections

  directory = readable_dir(directory, step)
  step = latest_step(directory) if step is None else step
  if not (directory / str(step) / "config").exists():
    return None
  with manager(directory, create=False) as mngr:
    values = mngr.restore(step, args=ocp.args.Composite(config=ocp.args.JsonRestore()))
  return ml_collections.ConfigDict(values["config"])


def read_model_config(directory: str | Path, step: int | None = None) -> ModelConfig:
  directory = readable_dir(directory, step)
  step = latest_step(directory) if step is None else step
  with manager(directory, create=False) as mngr:
    if step not in mngr.all_steps():
      raise CheckpointError(f"{directory} has no step {step}; it has {mngr.all_steps()}")
    if not (directory / str(step) / "model_config").exists():
      raise CheckpointError(f"{directory}/{step} has no model_config item; is it a cardjax "
                            "checkpoint?")
    values = mngr.restore(step, args=ocp.args.Composite(
        model_config=ocp.args.JsonRestore()))["model_config"]
  return ModelConfig.from_dict(values)


def restore_model(directory: str | Path, step: int | None = None, mesh=None,
                  lora_base: str | Path | None = None, **overrides) -> tuple[Decoder, int]:
  """(model, step) from a checkpoint; each parameter lands in its sharding on `mesh`.

  `overrides` change run-time fields (dtype, remat, attention_impl); fields that change the
  parameter tree (shapes, scan_layers, biases) must match the saved model. A LoRA run's
  checkpoint comes back merged (base + adapters, a plain Decoder); its base is read from
  where the run recorded it, or from `lora_base` when it has moved.
  """
  directory = readable_dir(directory, step)
  step = latest_step(directory) if step is None else step
  saved = read_model_config(directory, step)
  if (directory / str(step) / "lora").exists():
    return _restore_lora(directory, step, saved, mesh, lora_base, overrides), step
  structural = {"dtype", "remat", "attention_impl", "mask_token_id", "bos_token_id",
                "eos_token_id", "pad_token_id", "max_position_embeddings"}
  for key, value in overrides.items():
    if key not in structural and getattr(saved, key, value) != value:
      raise CheckpointError(f"{directory}/{step} was saved with model.{key}="
                            f"{getattr(saved, key)!r}; it cannot be restored as {value!r}")
  cfg = ModelConfig.from_dict({**saved.to_dict(), **overrides})
  graphdef, abstract_state = nnx.split(abstract_model(cfg, mesh))
  if mesh is None:
    # One device, whatever topology saved it (a pod's checkpoint exported on a laptop).
    one = jax.sharding.SingleDeviceSharding(jax.local_devices()[0])
    abstract_state = jax.tree.map(
        lambda v: jax.ShapeDtypeStruct(v.shape, v.dtype, sharding=one), abstract_state)
  target = nnx.to_pure_dict(abstract_state)
  with manager(directory, create=False) as mngr:
    try:
      restored = mngr.restore(step, args=ocp.args.Composite(
          params=ocp.args.StandardRestore(target)))["params"]
    except (ValueError, KeyError) as e:
      raise CheckpointError(f"{directory}/{step}: the saved parameters do not match the "
                            f"model config: {e}") from None
  nnx.replace_by_pure_dict(abstract_state, restored)
  return nnx.merge(graphdef, abstract_state), step


def load_model(source: str | Path, mesh=None, **overrides) -> tuple[Decoder, str]:
  """(model, description) from a HF folder (config.json) or a cardjax checkpoint folder:
  what train.init_from and a LoRA run's base may name."""
  path = resolve(source)
  if (checked_path(path) / "config.json").is_file():
    return hf.from_pretrained(cached_copy(path), mesh=mesh, **overrides), f"HF {path}"
  if checked_path(path).is_dir():
    model, step = restore_model(path, mesh=mesh, **overrides)
    return model, f"orbax {path} step {step}"
  raise CheckpointError(f"{source} is neither a HF folder (config.json) nor an orbax "
                        "checkpoint folder")


def lora_record(directory, step: int) -> dict:
  """A LoRA run's saved record at `step` (`directory` as readable_dir gives it): the
  adapters' spec and the base they sit on."""
  with manager(directory, create=False) as mngr:
    return mngr.restore(step, args=ocp.args.Composite(lora=ocp.args.JsonRestore()))["lora"]


def base_of_lora(directory, step: int, record: dict, moved_to: str | None = None) -> str:
  """Where the base of a LoRA run (its `record` at `step`) is: `moved_to` when given, else
  where the run read it; one error when nothing is there."""
  base = resolve(str(moved_to or record["base"]))
  if not checked_path(base).exists():
    raise CheckpointError(f"{directory}/{step} holds LoRA adapters over the base model "
                          f"{base}, which does not exist (moved or deleted?); pass its new "
                          "place (export-hf --lora-base PATH, or restore_model(lora_base=...)) "
                          "to read them")
  return base


def checkpoint_adapters(directory: str | Path, step: int | None = None, mesh=None) -> dict:
  """The LoRA adapters of a LoRA run's checkpoint, unmerged (a pure dict, the params item)."""
  from cardjax.model.lora_spec import LoraSpec

  directory = readable_dir(directory, step)
  step = latest_step(directory) if step is None else step
  if not (directory / str(step) / "lora").exists():
    raise CheckpointError(f"{directory}/{step} is not a LoRA run's checkpoint (no lora item)")
  spec = LoraSpec.from_dict(lora_record(directory, step))
  cfg = read_model_config(directory, step)
  _, abstract, _ = nnx.split(abstract_model(cfg, mesh, lora=spec), nnx.LoRAParam, nnx.Param)
  if mesh is None:
    one = jax.sharding.SingleDeviceSharding(jax.local_devices()[0])
    abstract = jax.tree.map(lambda v: jax.ShapeDtypeStruct(v.shape, v.dtype, sharding=one),
                            abstract)
  with manager(directory, create=False) as mngr:
    return mngr.restore(step, args=ocp.args.Composite(
        params=ocp.args.StandardRestore(nnx.to_pure_dict(abstract))))["params"]


def _restore_lora(directory, step: int, saved: ModelConfig, mesh, lora_base, overrides):
  """The merged model of a LoRA checkpoint: its base, loaded as the run loaded it, plus
  the adapters of `step`."""
  from cardjax.model import adapters
  from cardjax.model.lora_spec import LoraSpec

  record = lora_record(directory, step)
  spec = LoraSpec.from_dict(record)
  base = base_of_lora(directory, step, record, lora_base)
  runtime = {k: v for k, v in overrides.items()
             if k in ("dtype", "remat", "attention_impl", "mask_token_id")}
  model, _ = load_model(base, mesh=mesh, **runtime)
  shape_fields = ("vocab_size", "hidden_size", "intermediate_size", "num_layers", "num_heads",
                  "num_kv_heads", "head_dim", "scan_layers")
  differ = [f for f in shape_fields if getattr(model.cfg, f) != getattr(saved, f)]
  if differ:
    raise CheckpointError(f"{directory}/{step}: the adapters were trained on a model with "
                          f"other {', '.join(differ)} than the base {base} has now; pass the "
                          "base they were trained on (--lora-base)")
  restored = checkpoint_adapters(directory, step, mesh)
  return adapters.merge(adapters.attach(model, spec, adapters=restored))


def load_tokenizer(directory: str | Path, model_cfg, explicit: str | None = None):
  """The tokenizer of a checkpoint folder: `explicit` (a HF folder) if given, else its
  hf_assets/ (an import, or a training run: the trainer copies its tokenizer there), else
  the one its run config names (a run from before that copy)."""
  from cardjax.data.tokenizer import load_tokenizer as load_folder

  if explicit:
    return load_folder(cached_copy(explicit), mask_token_id=model_cfg.mask_token_id)
  assets = f"{resolve(directory)}/{ASSETS}"
  if (checked_path(assets) / "tokenizer.json").is_file():
    return load_folder(cached_copy(assets), mask_token_id=model_cfg.mask_token_id)
  config = read_run_config(directory)
  if config is None:
    raise CheckpointError(f"{directory} names no tokenizer; pass --tokenizer HF_FOLDER")
  from cardjax.config import merge_into_base
  from cardjax.data.prepare import load_data_tokenizer
  return load_data_tokenizer(merge_into_base(config))
