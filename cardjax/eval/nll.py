"""`cardjax eval --task nll`: the AR-order NLL (and perplexity) of a checkpoint on a split.

This is the trainer's validation, run on its own: the same batches (the first N of the
unshuffled split, N = train.eval_steps unless --batches says otherwise), the same jitted
eval step (cardjax/train/step.py: make_eval_step, so `ar_nll` is the trainer's
`eval/ar_nll` and `loss` its `eval/loss`) and the same averaging (cardjax/train/
validation.py). Any built dataset split can be scored; it is tokenized with the
checkpoint's own tokenizer.
"""

from __future__ import annotations

import contextlib
import copy
import math

from cardjax.errors import CardjaxError
from cardjax.storage import checked_path
from cardjax.storage.transfer import cached_copy


def data_config(run, dataset: str = "", data_dir: str = "", tokenizer: str = "",
                options: dict | None = None):
  """A config whose data section reads `dataset` (default: the run's; another one with its
  builder `options`, else its default build) with the run's tokenizer. A checkpoint
  without a run config (an import) gets base_config with its model's vocabulary and [MASK]
  id, and must name the dataset."""
  import ml_collections

  from cardjax.config import base_config
  from cardjax.data.prepare import SFT_DATASETS

  if run.config is None:
    if not dataset:
      raise CardjaxError(f"{run.root} has no run config, so no dataset of its own; pass "
                         "--dataset NAME (a built dataset, see `cardjax data build`)")
    config = base_config()
    config.model.vocab_size = run.model.cfg.vocab_size
    config.model.mask_token_id = run.model.cfg.mask_token_id
  else:
    config = copy.deepcopy(run.config)
  if dataset and dataset != config.data.dataset:
    # Another dataset: its default build, in the mode its rows need.
    config.data.dataset = dataset
    config.data.options = ml_collections.ConfigDict(options or {})
    config.data.mode = "sft" if dataset in SFT_DATASETS else "pretrain"
    config.data.eval_split = ""
  elif options:
    config.data.options = ml_collections.ConfigDict(options)
  if data_dir:
    config.data.data_dir = data_dir
  assets = f"{run.root}/hf_assets" if run.root else "hf_assets"
  if tokenizer:
    config.data.tokenizer = tokenizer
  elif (checked_path(assets) / "tokenizer.json").is_file():
    # The checkpoint's: the one the model was trained on (a bucket's: a local copy).
    config.data.tokenizer = str(cached_copy(assets))
  return config


def default_split(config) -> str:
  """The run's validation split, else the dataset's 'validation', else its 'test'."""
  from cardjax.data import builders
  from cardjax.data.prepare import builder_options, data_dir

  if config.data.eval_split:
    return config.data.eval_split
  builder = builders.make_builder(config.data.dataset, data_dir(config),
                                  **builder_options(config))
  available = list(builder.info.splits.keys()) if builder.is_prepared() else []
  for split in ("validation", "test"):
    if split in available:
      return split
  return "validation"  # load_source then names what is missing and how to build it


def validation_batches(config, split: str, batches: int = 0) -> list[dict]:
  """The first `batches` (0: train.eval_steps) batches of the unshuffled `split` under
  `config`'s data section: the batches the trainer's validation scores."""
  from cardjax.train import validation

  config = copy.deepcopy(config)
  config.data.eval_split = split
  if batches:
    config.train.eval_steps = batches
  if config.train.eval_steps < 1:
    raise CardjaxError(f"--batches {config.train.eval_steps} must be >= 1")
  return validation.eval_batches(config)


def evaluate_nll(run, config, split: str, batches: int = 0, mesh=None,
                 progress: bool = True) -> dict:
  """{'ar_nll', 'perplexity', 'loss', ...} of `run` on `batches` batches of `split`, on
  `mesh` (the one the run's parameters were restored on; None: one device)."""
  import jax
  from flax import nnx
  from tqdm import tqdm

  from cardjax.objectives import make_objective
  from cardjax.parallel import make_mesh, use_rules
  from cardjax.train import validation
  from cardjax.train.step import make_eval_step

  # The trainer's layout (rows over the data axes); its own config divided them.
  mesh = mesh or make_mesh(1, -1, 1, devices=jax.devices()[:1])
  if config.data.batch_size % mesh.size:
    raise CardjaxError(f"data.batch_size={config.data.batch_size} rows do not divide over "
                       f"{mesh.size} devices; run with JAX_PLATFORMS / CUDA_VISIBLE_DEVICES "
                       "set to a device count that divides it")
  data = validation_batches(config, split, batches)
  rules = config.mesh.rules or None
  with jax.set_mesh(mesh), (use_rules(rules) if rules else contextlib.nullcontext()):
    model = run.model
    objective = make_objective(config.objective, model.cfg)
    graphdef, params = nnx.split(model, nnx.Param)
    params = nnx.to_pure_dict(params)
    eval_fn = jax.jit(make_eval_step(graphdef, objective, config.seed, config.train.loss_chunk))
    bar = tqdm(data, desc=f"nll {config.data.dataset}/{split}", unit="batch",
               disable=not progress, dynamic_ncols=True)
    metrics = validation.evaluate(eval_fn, params, bar, mesh)
  tokens = sum(int(b["loss_mask"][:, 1:].sum()) for b in data)
  return {"ar_nll": metrics["ar_nll"], "perplexity": math.exp(metrics["ar_nll"]),
          "loss": metrics["loss"], "objective": objective.name,
          "dataset": config.data.dataset, "split": split, "batches": len(data),
          "rows": len(data) * config.data.batch_size, "seq_len": config.data.seq_len,
          "target_tokens": tokens}
