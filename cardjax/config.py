"""ml_collections configs: the schema with defaults, loading, overrides and validation.

A config file is Python (the user's own code, run as such) with `get_config()` or
`get_config(arg)` returning a ConfigDict. It is merged over `base_config()`, so every field
has a default, and any key the schema does not know is one clear ConfigError, raised before
anything compiles. `--config.a.b=v` overrides are parsed to the field's type.
"""

from __future__ import annotations

import ast
import dataclasses
import difflib
import importlib.util
from pathlib import Path
from typing import Any, Sequence

import ml_collections

from cardjax.errors import ConfigError
from cardjax.model.config import DTYPES, ModelConfig
from cardjax.model.lora_spec import spec_from_config

# The recipes: configs/ of a clone of the repository (an editable install), else the copy
# a wheel carries inside the package (cardjax/recipes, built from configs/ by setup.py).
REPO_CONFIGS = Path(__file__).resolve().parents[1] / "configs"
PACKAGED_CONFIGS = Path(__file__).resolve().parent / "recipes"


def recipes_dir() -> Path:
  """Where `--config NAME` and `configs/NAME.py` are found when the working directory has
  no such file."""
  return REPO_CONFIGS if REPO_CONFIGS.is_dir() else PACKAGED_CONFIGS


def base_config() -> ml_collections.ConfigDict:
  """Every key a config may set, with its default. Comments say what each one means."""
  c = ml_collections.ConfigDict()
  c.name = "run"  # a label for logs and run folders
  c.seed = 0  # the seed of parameter init (and, later, of data order and corruption)
  # The decoder; see cardjax/model/config.py for what each field means.
  c.model = ml_collections.ConfigDict(dataclasses.asdict(ModelConfig()))
  c.mesh = ml_collections.ConfigDict()
  c.mesh.data = 1  # data-parallel replicas
  c.mesh.fsdp = -1  # parameter-sharded data parallelism; -1 = all devices left over
  c.mesh.tensor = 1  # tensor (head / mlp / vocab) parallelism
  c.mesh.slices = 1  # TPU slices joined over DCN (multi-slice): the data axis spans them,
  #   so mesh.data must be a multiple; fsdp and tensor stay inside a slice's ICI
  c.mesh.rules = ()  # ((logical_axis, mesh_axes), ...) overriding the default rules table
  c.data = ml_collections.ConfigDict()
  c.data.dataset = "python_stdlib"  # a builder of cardjax.data.builders.BUILDERS
  c.data.options = ml_collections.ConfigDict()  # that builder's options (it checks them)
  c.data.data_dir = ""  # "" = $CARDJAX_DATA_DIR, else ~/tensorflow_datasets
  c.data.split = "train"  # the training split
  c.data.eval_split = "validation"  # the validation split ("test" for arith_sft)
  c.data.tokenizer = ""  # a HF folder with tokenizer.json; "" = a BPE trained on the dataset
  c.data.tokenizer_vocab = 512  # ids of the trained BPE (<= model.vocab_size)
  c.data.mode = "pretrain"  # pretrain (packed documents) | sft (conversations, loss mask)
  c.data.seq_len = 256  # tokens per row
  c.data.batch_size = 8  # global rows per step, over all hosts
  c.data.shuffle = True  # seeded (config.seed) shuffle, a new order each epoch
  c.data.num_epochs = 0  # 0 = repeat forever
  c.data.packing = True  # pack several examples per row (segment ids keep them apart)
  # SFT: EOS-pad each example to a multiple of this (MARS B); pretraining: pad each
  # document (pad_id, no loss) to it, so packed documents start at whole blocks.
  c.data.pad_to_multiple = 1
  c.data.sft_overflow = "truncate"  # SFT examples longer than seq_len: truncate | drop
  c.data.num_workers = 0  # grain worker processes (0 = in the training process)
  # Data shards (cardjax/data/shards.py): the split is read as this many contiguous ranges,
  # each resumable on its own; a run resumes on any host count that divides it (0 = one per
  # process at the run's start). Set it to a multiple of every host count the run may use.
  c.data.shards = 0
  # A data_dir in a bucket: a host fetches the shard files of its data shards as it reads
  # them, into a local cache of at most this many GB (0 = this host's share plus one file).
  c.data.cache_gb = 0.0
  c.objective = ml_collections.ConfigDict()
  c.objective.name = "ar"  # ar | card | mars | mdlm | bd3lm
  c.objective.block_size = 4  # B: MARS / BD3LM block length (must divide data.seq_len)
  c.objective.alpha = 1.0  # MARS: weight of the clean-stream (SFT) term
  # MARS: the noisy stream's length as a share of the row. 1.0: a full copy of the row
  # [clean | noisy]; below 1: only the blocks whose outputs carry loss, compacted into
  # ceil(share * L / B) blocks (the same loss for fewer tokens; a row that needs more
  # stops the run with the share it needed). docs/objectives.md
  c.objective.noisy_fraction = 1.0
  c.objective.card_masking = "soft_tail"  # soft_tail | strict_tail | uniform (ablations)
  c.objective.card_lambda = 1.5  # soft tail window W = min(L, floor(lambda * N))
  c.objective.card_reweighting = "context"  # context | none (ablation)
  c.objective.card_beta = 1.0  # w_q = 1 / (beta + S_q)
  c.objective.card_p = 0.5  # distance decay of S_q = C_q + (1 - p) S_{q-1}
  c.objective.clean_fraction = 0.0  # CARD: share of rows left uncorrupted (paper: 0)
  c.objective.t_eps = 1e-3  # MDLM / BD3LM: t ~ U(t_eps, 1)
  # MDLM: independent = a uniform per row; stratified = the step's rows cover [0, 1) evenly
  # (frac(u + r / rows), the low-discrepancy sampler: a lower-variance loss over t).
  c.objective.t_draw = "independent"
  c.objective.shift = False  # MDLM / BD3LM: True = output q predicts x_{q+1} (Dream style)
  c.train = ml_collections.ConfigDict()
  c.train.steps = 100  # optimizer steps
  c.train.lr = 3e-4  # peak learning rate
  c.train.schedule = "cosine"  # cosine | constant | wsd (warmup-stable-decay)
  c.train.warmup_steps = 0  # linear warmup steps; 0 = use warmup_fraction
  c.train.warmup_fraction = 0.0  # warmup as a share of train.steps (MARS recipe: 0.03)
  c.train.decay_fraction = 0.1  # wsd: the final share of steps that decays
  c.train.min_lr_ratio = 0.1  # final lr / peak lr (cosine, wsd)
  c.train.weight_decay = 0.1  # AdamW decay, never on norms or biases
  c.train.b1 = 0.9
  c.train.b2 = 0.95
  c.train.eps = 1e-8
  c.train.grad_clip = 1.0  # global-norm clipping; 0 = off
  c.train.grad_accum = 1  # micro-batches per step (data.batch_size rows in all)
  c.train.loss_chunk = 0  # positions per chunk of LM head + cross-entropy; 0 = logits of
  #   the whole batch at once (objectives/chunked_ce.py: same loss, far less memory)
  c.train.log_every = 10  # steps between metric lines (JSONL, TensorBoard)
  c.train.eval_every = 0  # steps between validations; 0 = only at the end
  c.train.eval_steps = 4  # validation batches (from data.eval_split)
  c.train.checkpoint_every = 100  # steps between checkpoints (and one at the end)
  c.train.keep_checkpoints = 3  # newest of those kept (and always the newest of all)
  c.train.checkpoint_minutes = 0.0  # also a save every this many minutes, kept until a
  #   newer step exists (0 = off; cardjax/train/timed_save.py)
  c.train.keep_every = 0  # milestones: every multiple of this many steps is kept for good
  c.train.async_checkpoint = True  # write checkpoints in the background
  c.train.init_from = ""  # "" = random init | a HF folder | an orbax checkpoint folder
  # An existing run resumes from its newest checkpoint; N > 0 resumes from step N instead
  # (e.g. when the newest cannot be read): the newer steps are set aside, not deleted.
  c.train.resume_step = 0
  # LoRA (docs/training.md): rank > 0 trains adapters on the targeted projections of the
  # train.init_from model, whose weights stay frozen; checkpoints hold the adapters only.
  c.train.lora = ml_collections.ConfigDict()
  c.train.lora.rank = 0  # 0 = off: train every weight
  c.train.lora.alpha = 0.0  # the update is (alpha / rank) B A x; 0 = rank (scale 1)
  c.train.lora.targets = "all"  # comma-separated of q,k,v,o,gate,up,down, or all
  c.train.lora.dropout = 0.0  # dropout on the adapters' input (training only)
  c.train.lora.base_dtype = ""  # store the frozen base in this dtype ("" = model.param_dtype)
  c.train.lora.init_from = ""  # a PEFT adapter folder to start the adapters from ("" =
  #   fresh ones); its rank, alpha and targets must be the ones above (docs/hf.md)
  c.train.progress = True  # a progress bar on the terminal
  # The stall watchdog (cardjax/train/watchdog.py): seconds with no finished step before
  # the run dumps every thread's stack to the log and exits 75 for its launcher to restart;
  # 0 = 20x the median step time, at least 600; negative = off. The first step (it compiles)
  # gets stall_first_timeout.
  c.train.stall_timeout = 0.0
  c.train.stall_first_timeout = 3600.0
  c.train.compilation_cache_dir = ""  # a persistent XLA cache ("" = off): a restarted
  #   pod job loads the compiled step instead of compiling it again
  c.train.profile_steps = ""  # "A:B": trace steps A to B into WORKDIR/profile ("" = off;
  #   `cardjax train --profile-steps A:B`, cardjax/train/profile.py)
  # Watching a run (docs/training.md): a bucket workdir's metrics.jsonl, tensorboard/ and
  # goodput.json are uploaded every this many seconds, checked at metrics lines (0 = at
  # every line), in the background; also at each checkpoint and at the end.
  c.train.metrics_sync_seconds = 60.0
  # Touching WORKDIR/PROFILE or SIGUSR1 to any host traces this many steps on every host
  # into WORKDIR/profile, from the step after the next metrics line (0 = off;
  # cardjax/train/profile_demand.py).
  c.train.profile_on_demand_steps = 5
  c.train.trackers = ""  # comma-separated experiment trackers, of: wandb ("" = none)
  c.train.wandb_project = "cardjax"  # the W&B project of train.trackers=wandb
  return c


# The experiment trackers of train.trackers (cardjax/train/trackers.py): how to install each.
TRACKERS = {"wandb": "pip install 'cardjax[wandb]'"}


def tracker_names(text: str) -> list[str]:
  """The names in `text`; an unknown one is a ConfigError listing the known ones."""
  names = [n.strip() for n in str(text).split(",") if n.strip()]
  unknown = [n for n in names if n not in TRACKERS]
  if unknown:
    raise ConfigError(f"config train.trackers={text!r}: unknown tracker "
                      f"{', '.join(map(repr, unknown))}; known: {', '.join(TRACKERS)}")
  return names


# Sections whose keys belong to someone else (a dataset builder checks its own options).
FREE_FORM = ("data.options",)


def _suggest(key: str, known: Sequence[str], prefix: str = "") -> str:
  close = difflib.get_close_matches(key, list(known), n=1)
  return (f"; did you mean {prefix + close[0]!r}?" if close
          else f"; known keys: {sorted(known)}")


def merge_into_base(user: ml_collections.ConfigDict | dict, base=None, prefix: str = ""):
  """A copy of `base` with every key of `user` set; unknown keys are ConfigErrors."""
  base = base_config() if base is None else base
  for key, value in (user.items() if hasattr(user, "items") else []):
    name = f"{prefix}{key}"
    if key not in base:
      raise ConfigError(f"unknown config key {name!r}{_suggest(key, list(base.keys()), prefix)}")
    if name in FREE_FORM:
      base[key] = ml_collections.ConfigDict(dict(value))
    elif isinstance(base[key], ml_collections.ConfigDict):
      if not hasattr(value, "items"):
        raise ConfigError(f"config key {name!r} is a section; got {value!r}")
      merge_into_base(value, base[key], prefix=f"{name}.")
    else:
      _assign(base, key, value, name)
  return base


def _assign(section, key: str, value: Any, name: str) -> None:
  default = section[key]
  if isinstance(default, bool) and not isinstance(value, bool):
    raise ConfigError(f"config {name}={value!r}: expected true or false")
  if isinstance(default, float) and isinstance(value, int) and not isinstance(value, bool):
    value = float(value)
  if isinstance(default, (tuple, list)) and isinstance(value, list):
    value = tuple(value)
  try:
    section[key] = value
  except (TypeError, ValueError) as e:
    raise ConfigError(f"config {name}={value!r}: expected {type(default).__name__} ({e})") \
        from None


def _parse_value(text: str) -> Any:
  lowered = text.lower()
  if lowered in ("true", "false"):
    return lowered == "true"
  if lowered in ("none", "null"):
    return None
  try:
    return ast.literal_eval(text)
  except (ValueError, SyntaxError):
    return text  # a bare string such as bfloat16


def apply_overrides(config: ml_collections.ConfigDict, overrides: Sequence[str]):
  """Apply ['--config.model.num_layers=4', ...] (the leading '--config.' is optional)."""
  for item in overrides:
    text = item[2:] if item.startswith("--") else item
    if not text.startswith("config.") or "=" not in text:
      raise ConfigError(f"cannot parse override {item!r}; write --config.section.key=value")
    dotted, raw = text[len("config."):].split("=", 1)
    *parents, leaf = dotted.split(".")
    section = config
    for depth, part in enumerate(parents):
      if part not in section or not isinstance(section[part], ml_collections.ConfigDict):
        where = ".".join(parents[:depth]) or "the config"
        raise ConfigError(f"override {item!r}: no section {part!r} in {where}"
                          f"{_suggest(part, list(section.keys()))}")
      section = section[part]
    if ".".join(parents) in FREE_FORM:
      section[leaf] = _parse_value(raw)
      continue
    if leaf not in section:
      parent = ".".join(parents) + "." if parents else ""
      raise ConfigError(f"override {item!r}: unknown key {dotted!r}"
                        f"{_suggest(leaf, list(section.keys()), parent)}")
    value = _parse_value(raw)
    if isinstance(section[leaf], str) and not isinstance(value, str):
      value = raw  # a text field keeps the text: remat=none is "none", not None
    _assign(section, leaf, value, dotted)
  return config


def _resolve_path(spec: str) -> tuple[Path, str | None]:
  path_text, _, arg = spec.partition(":")
  path = Path(path_text)
  recipes = recipes_dir()
  candidates = [path, recipes / path, recipes / f"{path_text}.py"]
  if path.parts[:1] == ("configs",):  # configs/NAME.py of the repository, from anywhere
    candidates.append(recipes.joinpath(*path.parts[1:]))
  for candidate in candidates:
    if candidate.is_file():
      return candidate, (arg or None)
  names = ", ".join(sorted(p.stem for p in recipes.glob("*.py"))) or "none found"
  raise ConfigError(f"config file {path_text!r} not found (looked in the working directory "
                    f"and {recipes}, whose recipes are: {names}); pass a path to a config "
                    "file or one of those names")


def config_module(path: Path):
  """The config file at `path` run as a module (its get_config and any helpers it defines)."""
  module_spec = importlib.util.spec_from_file_location(f"cardjax_config_{path.stem}", path)
  module = importlib.util.module_from_spec(module_spec)
  module_spec.loader.exec_module(module)
  return module


def load_config(spec: str, overrides: Sequence[str] = ()) -> ml_collections.ConfigDict:
  """Load `path.py` or `path.py:arg`, merge over the schema, apply overrides, validate."""
  path, arg = _resolve_path(spec)
  module = config_module(path)
  if not hasattr(module, "get_config"):
    raise ConfigError(f"{path} has no get_config() function")
  user = module.get_config(arg) if arg is not None else module.get_config()
  config = merge_into_base(user)
  apply_overrides(config, overrides)
  validate(config)
  return config


def model_config(config: ml_collections.ConfigDict) -> ModelConfig:
  return ModelConfig.from_dict(config.model.to_dict())


def validate(config: ml_collections.ConfigDict) -> ml_collections.ConfigDict:
  """Cross-field checks; every failure is one ConfigError naming the key and the fix."""
  model_config(config)
  for axis in ("data", "fsdp", "tensor"):
    size = config.mesh[axis]
    if size == 0 or size < -1:
      raise ConfigError(f"config mesh.{axis}={size}: use a positive size or -1 (fill)")
  if sum(config.mesh[a] == -1 for a in ("data", "fsdp", "tensor")) > 1:
    raise ConfigError("config mesh: at most one of data/fsdp/tensor may be -1")
  for rule in config.mesh.rules:
    if len(rule) != 2:
      raise ConfigError(f"config mesh.rules entry {rule!r}: expected (logical_axis, mesh_axes)")
  d = config.data
  if d.mode not in ("pretrain", "sft"):
    raise ConfigError(f"config data.mode={d.mode!r}: must be 'pretrain' or 'sft'")
  if d.seq_len <= 1 or d.batch_size <= 0:
    raise ConfigError(f"config data.seq_len={d.seq_len} / data.batch_size={d.batch_size}: "
                      "must be > 1 and > 0")
  if d.pad_to_multiple <= 0 or d.seq_len % d.pad_to_multiple:
    raise ConfigError(f"config data.pad_to_multiple={d.pad_to_multiple} must divide "
                      f"data.seq_len={d.seq_len} (the MARS block size must divide the length)")
  if d.sft_overflow not in ("truncate", "drop"):
    raise ConfigError(f"config data.sft_overflow={d.sft_overflow!r}: truncate | drop")
  o, t = config.objective, config.train
  if o.name in ("mars", "bd3lm") and (o.block_size <= 0 or d.seq_len % o.block_size):
    raise ConfigError(f"config objective.block_size={o.block_size} must divide "
                      f"data.seq_len={d.seq_len}")
  if o.name == "mars" and d.mode == "sft" and d.pad_to_multiple % o.block_size:
    raise ConfigError(f"config data.pad_to_multiple={d.pad_to_multiple} must be a multiple "
                      f"of objective.block_size={o.block_size} (MARS pads responses to whole "
                      "blocks)")
  if o.name == "mars" and not 0 < o.get("noisy_fraction", 1.0) <= 1:
    raise ConfigError(f"config objective.noisy_fraction={o.noisy_fraction} must be in (0, 1] "
                      "(1: the full noisy copy of the row; e.g. 0.6 when responses fill at "
                      "most about half of each row)")
  impl = config.model.get("attention_impl", "xla")
  if (o.name in ("mars", "bd3lm") and d.packing and d.pad_to_multiple % o.block_size
      and impl in ("splash", "auto")):
    raise ConfigError(
        f"config data.pad_to_multiple={d.pad_to_multiple} must be a multiple of "
        f"objective.block_size={o.block_size} with packed rows and model.attention_impl="
        f"{impl}: splash (which auto picks on TPU) needs every packed document to start at a "
        f"whole block; set --config.data.pad_to_multiple={o.block_size} (documents are "
        "padded, the padding gets no loss) or --config.model.attention_impl=xla")
  if t.loss_chunk < 0:
    raise ConfigError(f"config train.loss_chunk={t.loss_chunk} must be >= 0 "
                      "(0 = the whole sequence at once)")
  if t.grad_accum <= 0 or d.batch_size % t.grad_accum:
    raise ConfigError(f"config train.grad_accum={t.grad_accum} must divide "
                      f"data.batch_size={d.batch_size}")
  if t.steps <= 0 or t.lr <= 0:
    raise ConfigError(f"config train.steps={t.steps} and train.lr={t.lr} must be > 0")
  if t.metrics_sync_seconds < 0 or t.profile_on_demand_steps < 0:
    raise ConfigError(f"config train.metrics_sync_seconds={t.metrics_sync_seconds} and "
                      f"train.profile_on_demand_steps={t.profile_on_demand_steps} must be >= 0")
  if t.trackers:  # an unknown tracker is one error naming the known ones
    tracker_names(t.trackers)
  if t.checkpoint_minutes < 0 or t.keep_every < 0:
    raise ConfigError(f"config train.checkpoint_minutes={t.checkpoint_minutes} and "
                      f"train.keep_every={t.keep_every} must be >= 0 (0 = off)")
  if t.resume_step < 0:
    raise ConfigError(f"config train.resume_step={t.resume_step} must be >= 0 (0: the newest "
                      "checkpoint)")
  if spec_from_config(t.lora) is not None:
    if not t.init_from:
      raise ConfigError("config train.lora.rank > 0 adapts a trained model: set "
                        "train.init_from to its HF folder or checkpoint folder")
    if t.lora.base_dtype and t.lora.base_dtype not in DTYPES:
      raise ConfigError(f"config train.lora.base_dtype={t.lora.base_dtype!r}: one of "
                        f"{DTYPES}, or '' for model.param_dtype")
  elif t.lora.init_from:
    raise ConfigError(f"config train.lora.init_from={t.lora.init_from!r} continues a LoRA "
                      "adapter: set train.lora.rank (and alpha, targets) to the adapter's")
  if d.tokenizer_vocab > config.model.vocab_size and not d.tokenizer:
    raise ConfigError(f"config data.tokenizer_vocab={d.tokenizer_vocab} exceeds "
                      f"model.vocab_size={config.model.vocab_size}")
  return config
