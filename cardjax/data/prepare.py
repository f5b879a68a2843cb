"""Everything a run needs from its `data` config section: the built dataset split, the
tokenizer, and the pipeline spec.

`prepare(config)` builds (once) the tfds dataset and, unless `data.tokenizer` names a HF
folder, a byte-level BPE trained on the train split. Runs only read what is built: a
missing build is an error that prints the `cardjax data build` command. data.data_dir and
data.tokenizer may be bucket URIs (gs://, s3://); their paths are then etils.epath paths.
"""

from __future__ import annotations

import itertools
import logging
import os
from pathlib import Path

from cardjax.data import builders
from cardjax.data.pipeline import DataLoader, PipelineSpec
from cardjax.data.tokenizer import Tokenizer, load_tokenizer, train_bpe
from cardjax.errors import CardjaxError
from cardjax.storage import as_path, is_remote, resolve

log = logging.getLogger("cardjax.data")
SFT_DATASETS = ("sft_jsonl", "arith_sft")
TOKENIZER_TRAIN_CHARS = 20_000_000  # enough text for a small BPE, seconds to train


def _path(value):
  """A local folder as an absolute pathlib.Path, a bucket URI as an etils.epath.Path."""
  return as_path(value) if is_remote(value) else Path(resolve(value))


def data_dir(config):
  """data.data_dir, else $CARDJAX_DATA_DIR, else ~/tensorflow_datasets (tfds' default)."""
  value = config.data.data_dir or os.environ.get("CARDJAX_DATA_DIR") or "~/tensorflow_datasets"
  return _path(value)


def builder_options(config) -> dict:
  """The dataset builder's options from data.options."""
  return dict(config.data.options.to_dict()) if hasattr(config.data.options, "to_dict") \
      else dict(config.data.options)


def tokenizer_dir(config):
  """Where the dataset's own BPE lives: one per (dataset build, vocab size)."""
  builder = builders.make_builder(config.data.dataset, data_dir(config), **builder_options(config))
  name = f"{config.data.dataset}-{builder.builder_config.name}-bpe{config.data.tokenizer_vocab}"
  return data_dir(config) / "tokenizers" / name


def _training_texts(source, limit_chars: int):
  total = 0
  for i in range(len(source)):
    example = builders.decode(source[i])
    if "text" in example:
      text = example["text"]
    else:
      text = "\n".join(m["content"] for m in example["messages"])
    yield text
    total += len(text)
    if total >= limit_chars:
      return


def prepare(config, beam_runner: str | None = None,
            beam_options: str = "") -> tuple[object, Tokenizer]:
  """Build the dataset (on Apache Beam when `beam_runner` is given) and its tokenizer when
  missing; return (builder, tokenizer)."""
  root = data_dir(config)
  builder = builders.build(config.data.dataset, root, beam_runner=beam_runner,
                           beam_options=beam_options, **builder_options(config))
  if config.data.tokenizer:
    return builder, load_tokenizer(config.data.tokenizer)
  target = tokenizer_dir(config)
  if (target / "tokenizer.json").is_file():
    return builder, load_tokenizer(target)
  source = builder.as_data_source(split="train")
  log.info("training a %d-id byte-level BPE on %s -> %s", config.data.tokenizer_vocab,
           config.data.dataset, target)
  tokenizer = train_bpe(_training_texts(source, TOKENIZER_TRAIN_CHARS),
                        config.data.tokenizer_vocab, target)
  return builder, tokenizer


def tokenizer_source(config):
  """The folder of the run's tokenizer: data.tokenizer, else the dataset's own BPE (an
  etils.epath.Path when it is in a bucket)."""
  return _path(config.data.tokenizer) if config.data.tokenizer else tokenizer_dir(config)


def load_data_tokenizer(config) -> Tokenizer:
  """The run's tokenizer, checked against the model's vocab and [MASK] id."""
  path = tokenizer_source(config)
  if not config.data.tokenizer and not (path / "tokenizer.json").is_file():
    raise CardjaxError(f"the tokenizer of dataset {config.data.dataset} is not built ({path}); "
                       f"run `{build_command(config)}`")
  tokenizer = load_tokenizer(path, mask_token_id=config.model.mask_token_id)
  if tokenizer.vocab_size > config.model.vocab_size:
    raise CardjaxError(f"the tokenizer at {path} has {tokenizer.vocab_size} ids but "
                       f"model.vocab_size={config.model.vocab_size}; raise model.vocab_size "
                       f"or lower data.tokenizer_vocab")
  return tokenizer


def build_command(config) -> str:
  command = builders.build_command(config.data.dataset, data_dir(config), **builder_options(config))
  return command + f" --tokenizer-vocab {config.data.tokenizer_vocab}"


def pipeline_spec(config, **changes) -> PipelineSpec:
  d = config.data
  spec = PipelineSpec(mode=d.mode, seq_len=d.seq_len, batch_size=d.batch_size, seed=config.seed,
                      shuffle=d.shuffle, num_epochs=d.num_epochs, packing=d.packing,
                      pad_to_multiple=d.pad_to_multiple, sft_overflow=d.sft_overflow,
                      num_workers=d.num_workers, vocab_limit=config.model.vocab_size,
                      shards=d.shards, cache_gb=d.cache_gb)
  if d.mode == "sft" and d.dataset not in SFT_DATASETS:
    raise CardjaxError(f"data.mode='sft' needs a conversation dataset {SFT_DATASETS}, "
                       f"got data.dataset={d.dataset!r}")
  if d.mode == "pretrain" and d.dataset in SFT_DATASETS:
    raise CardjaxError(f"data.dataset={d.dataset!r} holds conversations; set data.mode='sft'")
  return PipelineSpec(**{**spec.__dict__, **changes}).validate()


def make_loader(config, split: str | None = None, mesh=None, process_index=None,
                process_count=None, **changes) -> DataLoader:
  """The DataLoader of `split` (default data.split) as the config describes it."""
  source = builders.load_source(config.data.dataset, split or config.data.split,
                                data_dir(config), **builder_options(config))
  return DataLoader(source, load_data_tokenizer(config), pipeline_spec(config, **changes),
                    mesh=mesh, process_index=process_index, process_count=process_count)


def sample(config, split: str, n: int) -> list[dict]:
  """The first n stored examples of a split, decoded (for `cardjax data show`)."""
  source = builders.load_source(config.data.dataset, split, data_dir(config),
                                **builder_options(config))
  return [builders.decode(source[i]) for i in itertools.islice(range(len(source)), n)]
