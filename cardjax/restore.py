"""A checkpoint made ready to use: the model, its run config, tokenizer and objective.

`cardjax generate`, `cardjax eval`, the decode benchmarks and the demo all start from a run
folder (or its checkpoints/). The decoders themselves (cardjax/decoding/) take token arrays
and a model only, so reading checkpoints and tokenizers lives here, one level above them.
"""

from __future__ import annotations

import dataclasses
import functools
from pathlib import Path


@dataclasses.dataclass
class LoadedRun:
  model: object
  config: object | None  # the run's full config (merged over base_config); None: an import
  tokenizer: object
  objective: str | None  # the training objective; None: unknown (an HF / GGUF import)
  step: int = 0
  root: Path | None = None  # the checkpoints folder (an epath.Path: local or a bucket)

  @functools.cached_property
  def frozen(self):
    """The model split once: decoders built on it share their compiled loops."""
    from cardjax.decoding.frozen import Frozen
    return Frozen(self.model)

  @property
  def run_config(self) -> dict | None:
    """The run config as a plain dict (what decoding.cli.resolve_block reads)."""
    return None if self.config is None else self.config.to_dict()

  @property
  def shift(self) -> bool:
    """Whether the run trained Dream-style (objective.shift: the output at q - 1 predicts
    q), which its decoders and scorers must follow; False for an import."""
    return bool((self.run_config or {}).get("objective", {}).get("shift", False))


def checkpoints_dir(run_dir: str | Path) -> Path:
  """RUN/checkpoints for a training run folder, else the folder itself (local, gs://,
  s3://)."""
  from cardjax.storage import checked_path

  root = checked_path(run_dir)
  return root / "checkpoints" if (root / "checkpoints").is_dir() else root


def run_config(run_dir: str | Path):
  """The run config `run_dir` (a run folder or its checkpoints/) was trained with, merged
  into the base config; None for an import, which records none. A missing folder is one
  CheckpointError."""
  from cardjax import checkpoint
  from cardjax.config import merge_into_base

  raw = checkpoint.read_run_config(checkpoints_dir(run_dir))
  return local_data_dir(merge_into_base(raw), run_dir) if raw is not None else None


_SAID: set = set()


def local_data_dir(config, where=""):
  """`config` with a stored data.data_dir that does not exist here replaced by the caller's
  ("": $CARDJAX_DATA_DIR, else ~/tensorflow_datasets), said once per folder. A run keeps
  the data folder of the machine that trained it; on another machine (a kept run, a copied
  one) that path means nothing, and reading datasets from it would fail."""
  import logging
  import os

  from cardjax.storage import is_remote

  stored = config.data.data_dir
  if not stored or is_remote(stored) or os.path.isdir(os.path.expanduser(stored)):
    return config
  config.data.data_dir = ""
  if stored not in _SAID:
    _SAID.add(stored)
    here = os.environ.get("CARDJAX_DATA_DIR") or "~/tensorflow_datasets"
    logging.getLogger("cardjax.restore").warning(
        "%s was trained with data folder %s, which is not on this machine; its datasets are "
        "read from %s instead (--data-dir or CARDJAX_DATA_DIR to choose)",
        where or "a run", stored, here)
  return config


def run_objective(run_dir: str | Path, objective: str = "") -> str | None:
  """The objective load_run records for `run_dir`: `objective` when given, else its run
  config's (None for an import), read without the weights."""
  if objective:
    return objective
  config = run_config(run_dir)
  return config.objective.name if config is not None else None


def load_run(run_dir: str | Path, mesh=None, tokenizer: str = "", objective: str = "",
             method: str = "", dtype: str = "") -> LoadedRun:
  """The latest checkpoint of `run_dir` with its config, tokenizer and objective.
  `tokenizer` (a HF folder) replaces the checkpoint's own; `objective` overrides the
  training objective the run config records (an import records none), which decides the
  decoding methods that fit; `method`, when given, is checked against it before the weights
  are read, so a method the checkpoint cannot serve fails at once. `dtype` (e.g. bfloat16):
  compute in it and store the weights in it, half the bytes a decoding forward reads."""
  from cardjax import checkpoint

  root = checkpoints_dir(run_dir)
  config = run_config(root)
  name = objective or (config.objective.name if config is not None else None)
  if method:
    from cardjax.decoding.methods import check_method
    check_method(method, name, where=str(root))
  model, step = checkpoint.restore_model(root, mesh=mesh, **({"dtype": dtype} if dtype else {}))
  if dtype:
    import dataclasses

    from cardjax.model import cast_params

    model = cast_params(model, dtype)
    model.cfg = dataclasses.replace(model.cfg, param_dtype=dtype)  # what it now stores
  tok = checkpoint.load_tokenizer(root, model.cfg, tokenizer or None)
  return LoadedRun(model, config, tok, name, step, root)
