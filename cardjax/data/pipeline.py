"""grain pipelines: records -> tokens -> packed or padded rows -> per-host batches.

Order is a pure function of (seed, index): the source is a random-access tfds ArrayRecord
data source cut into data shards (contiguous record ranges, cardjax/data/shards.py), each
shuffled per epoch by grain and repeated; a host reads its shards, so hosts see disjoint
examples and one epoch over all hosts covers every example once. Each shard's pipeline:

  pretrain: text + EOS -> split into <= seq_len chunks (long documents are split, never
            dropped) -> first-fit packing with segment ids and per-document positions
  sft:      chat-rendered ids + loss mask (1 on response tokens) -> EOS-padded to a
            multiple of the MARS block size -> packed, or padded to seq_len

then batches of batch_size / shards rows; a host lays its shards' batches side by side.
Batches are dicts of int32 numpy arrays [per_host_batch, seq_len]: tokens, positions,
segment_ids (0 = padding), loss_mask. `to_global` turns them into global jax.Arrays.
The shards' iterator states (one file per shard in a checkpoint) are what a run resumes
from, on any number of hosts that divides the shard count.
"""

from __future__ import annotations

import atexit
import collections
import dataclasses
import gc
import logging
import weakref
from typing import Any

import grain
import grain.experimental as grain_exp
import jax
import numpy as np
from jax.sharding import NamedSharding

from cardjax.data import shards as data_shards
from cardjax.data.lazy_source import LazySource, fit_cache
from cardjax.data.tokenizer import Tokenizer
from cardjax.errors import CardjaxError
from cardjax.parallel.sharding import logical_to_spec

log = logging.getLogger("cardjax.data")
KEYS = ("tokens", "positions", "segment_ids", "loss_mask")

# What the transforms split, truncated or dropped, counted in this process (grain worker
# processes keep their own counts and log them).
STATS: collections.Counter = collections.Counter()


def _count(what: str, n: int = 1) -> None:
  STATS[what] += n
  if STATS[what] in (1, 10, 100, 1000, 10000):
    log.warning("data: %s so far: %d", what, STATS[what])


@dataclasses.dataclass(frozen=True)
class PipelineSpec:
  """How rows are made; `cardjax.data.config` builds it from the `data` config section."""

  mode: str = "pretrain"  # pretrain | sft
  seq_len: int = 256
  batch_size: int = 8  # global rows per step, over all hosts
  seed: int = 0
  shuffle: bool = True
  num_epochs: int = 0  # 0 = repeat forever
  packing: bool = True
  # SFT examples are EOS-padded to a multiple of this (MARS B); pretraining documents are
  # padded with pad_id (no loss) to it: every packed document starts at a multiple of it.
  pad_to_multiple: int = 1
  sft_overflow: str = "truncate"  # truncate | drop, for conversations longer than seq_len
  num_workers: int = 0  # grain worker processes (0 = in this process)
  packing_bins: int = 0  # first-fit bins (0 = a shard's rows per step)
  shards: int = 0  # data shards (cardjax/data/shards.py); 0 = one per process
  cache_gb: float = 0.0  # a bucket build's local shard cache (0 = this host's share)
  vocab_limit: int = 0  # ids must be < this (the model's vocab_size); 0 = unchecked

  def validate(self) -> "PipelineSpec":
    def bad(key, why):
      raise CardjaxError(f"data.{key}={getattr(self, key)!r}: {why}")

    if self.mode not in ("pretrain", "sft"):
      bad("mode", "must be 'pretrain' or 'sft'")
    if self.seq_len <= 1:
      bad("seq_len", "must be > 1")
    if self.batch_size <= 0:
      bad("batch_size", "must be > 0")
    if self.pad_to_multiple <= 0 or self.seq_len % self.pad_to_multiple:
      bad("pad_to_multiple", f"must be > 0 and divide data.seq_len={self.seq_len} (the MARS "
                             "block size must divide the sequence length)")
    if self.sft_overflow not in ("truncate", "drop"):
      bad("sft_overflow", "must be 'truncate' or 'drop'")
    if self.num_epochs < 0 or self.num_workers < 0:
      bad("num_epochs" if self.num_epochs < 0 else "num_workers", "must be >= 0")
    return self


def _check_ids(ids: np.ndarray, limit: int) -> np.ndarray:
  if limit and ids.size and (ids.max() >= limit or ids.min() < 0):
    raise CardjaxError(f"token id {int(ids.max())} is out of range for model.vocab_size="
                       f"{limit}; the tokenizer has more ids than the model (raise "
                       "model.vocab_size or use a smaller tokenizer)")
  return ids


def _text(example: dict) -> str:
  value = example["text"]
  return value.decode("utf-8") if isinstance(value, bytes) else value


class TokenizeText(grain.transforms.Map):
  """A document's ids followed by EOS (the separator packed documents train on).

  With multiple > 1 the document is padded with pad_id, which gets no loss, to a multiple
  of it, so every packed document starts at a multiple of it in its row: whole MARS /
  BD3LM blocks per document, the layout splash attention needs (docs/attention.md)."""

  def __init__(self, tokenizer: Tokenizer, vocab_limit: int, multiple: int = 1):
    self.tokenizer, self.vocab_limit, self.multiple = tokenizer, vocab_limit, multiple

  def map(self, example):
    ids = np.asarray(self.tokenizer.encode(_text(example)) + [self.tokenizer.eos_id], np.int32)
    ids = _check_ids(ids, self.vocab_limit)
    if self.multiple == 1:
      return {"tokens": ids}
    pad = (-len(ids)) % self.multiple
    return {"tokens": np.concatenate([ids, np.full(pad, self.tokenizer.pad_id, np.int32)]),
            "loss_mask": np.concatenate([np.ones(len(ids), np.int32),
                                         np.zeros(pad, np.int32)])}


class SplitLong(grain_exp.FlatMapTransform):
  """Chunks of at most seq_len tokens; a longer document is split, not dropped."""

  def __init__(self, seq_len: int):
    self.seq_len = seq_len

  def flat_map(self, row):
    n = len(row["tokens"])
    if n > self.seq_len:
      _count("documents split (longer than seq_len)")
    return [{k: v[start:start + self.seq_len] for k, v in row.items()}
            for start in range(0, n, self.seq_len)]


class ChatRow(grain_exp.FlatMapTransform):
  """A conversation's ids and loss mask, EOS-padded to a multiple of the block size.

  The EOS padding is trained on (mask 1): the model learns to end the response, and the
  MARS blocks of a response are whole. A dropped conversation gives an empty list.
  """

  def __init__(self, tokenizer: Tokenizer, spec: PipelineSpec, epoch_size: int = 0):
    self.tokenizer, self.spec = tokenizer, spec
    # A repeated split whose every conversation is dropped would make the pipeline look for
    # a row forever: after more consecutive drops than the split holds, nothing can come.
    self.epoch_size, self.dropped_in_a_row = epoch_size, 0

  def flat_map(self, example):
    rows = self._rows(example)
    self.dropped_in_a_row = 0 if rows else self.dropped_in_a_row + 1
    if self.epoch_size and self.dropped_in_a_row > self.epoch_size:
      # Truncating still drops a conversation whose prompt alone fills seq_len: then
      # sft_overflow=truncate is no fix to suggest.
      fix = ("raise data.seq_len or use a split with shorter prompts"
             if self.spec.sft_overflow == "truncate" else
             "raise data.seq_len, set data.sft_overflow=truncate, or use a split with shorter "
             "conversations")
      raise CardjaxError(
          f"every conversation of the split is dropped: none fits data.seq_len="
          f"{self.spec.seq_len} with a response token left (data.sft_overflow="
          f"{self.spec.sft_overflow!r}); {fix}")
    return rows

  def _rows(self, example):
    import json

    messages = example["messages"]
    if isinstance(messages, bytes):
      messages = messages.decode("utf-8")
    if isinstance(messages, str):
      messages = json.loads(messages)
    ids, mask = self.tokenizer.encode_chat(messages)
    _check_ids(ids, self.spec.vocab_limit)
    b, limit = self.spec.pad_to_multiple, self.spec.seq_len
    pad = (-len(ids)) % b
    ids = np.concatenate([ids, np.full(pad, self.tokenizer.eos_id, np.int32)])
    mask = np.concatenate([mask, np.ones(pad, np.int32)])
    if len(ids) > limit:
      if self.spec.sft_overflow == "drop":
        _count("conversations dropped (longer than seq_len)")
        return []
      _count("conversations truncated (longer than seq_len)")
      ids, mask = ids[:limit], mask[:limit]
    if mask.sum() == 0:
      _count("conversations dropped (no response token left)")
      return []
    return [{"tokens": ids, "loss_mask": mask}]


def _from_packed(row: dict) -> dict:
  segments = row["tokens_segment_ids"].astype(np.int32)
  loss = row["loss_mask"] if "loss_mask" in row else (segments > 0)
  return {"tokens": row["tokens"].astype(np.int32),
          "positions": row["tokens_positions"].astype(np.int32),
          "segment_ids": segments, "loss_mask": np.asarray(loss, np.int32) * (segments > 0)}


class PadRow(grain.transforms.Map):
  """One example per row: pad to seq_len with pad_id, segment 0 and no loss."""

  def __init__(self, seq_len: int, pad_id: int):
    self.seq_len, self.pad_id = seq_len, pad_id

  def map(self, row):
    n, length = len(row["tokens"]), self.seq_len
    tokens = np.full(length, self.pad_id, np.int32)
    tokens[:n] = row["tokens"]
    loss = np.zeros(length, np.int32)
    loss[:n] = row.get("loss_mask", np.ones(n, np.int32))
    segments = np.zeros(length, np.int32)
    segments[:n] = 1
    positions = np.zeros(length, np.int32)
    positions[:n] = np.arange(n)
    return {"tokens": tokens, "positions": positions, "segment_ids": segments,
            "loss_mask": loss}


class FillBatch(grain.transforms.Map):
  def __init__(self, rows: int, pad_id: int):
    self.rows, self.pad_id = rows, pad_id

  def map(self, batch):
    missing = self.rows - len(batch["tokens"])
    if not missing:
      return batch
    fill = {k: np.full((missing,) + v.shape[1:], self.pad_id if k == "tokens" else 0, v.dtype)
            for k, v in batch.items()}
    return {k: np.concatenate([batch[k], fill[k]]) for k in batch}


def host_slice(process_index: int | None, process_count: int | None) -> tuple[int, int]:
  index = jax.process_index() if process_index is None else process_index
  count = jax.process_count() if process_count is None else process_count
  if not 0 <= index < count:
    raise CardjaxError(f"process_index {index} is outside [0, {count})")
  return index, count


def shard_dataset(source, tokenizer: Tokenizer, spec: PipelineSpec, shard: int,
                  shards: int) -> grain.IterDataset:
  """The grain IterDataset of one data shard's batches (dicts of [batch_size / shards,
  seq_len]): its contiguous range of records, shuffled with its own seed each epoch."""
  rows = spec.batch_size // shards
  lo, hi = data_shards.record_range(len(source), shard, shards)
  ds = grain.MapDataset.source(source)[lo:hi]
  if spec.shuffle:
    ds = ds.shuffle(seed=spec.seed + shard)  # a new permutation each epoch
  ds = ds.repeat(spec.num_epochs or None)
  it = ds.to_iter_dataset()
  if spec.mode == "pretrain":
    tokenize = TokenizeText(tokenizer, spec.vocab_limit, spec.pad_to_multiple)
    it = grain_exp.FlatMapIterDataset(it.map(tokenize), SplitLong(spec.seq_len))
    features = ("tokens",) if spec.pad_to_multiple == 1 else ("tokens", "loss_mask")
  else:
    it = grain_exp.FlatMapIterDataset(it, ChatRow(tokenizer, spec, hi - lo))
    features = ("tokens", "loss_mask")
  if spec.packing:
    it = grain_exp.FirstFitPackIterDataset(
        it, length_struct={k: spec.seq_len for k in features},
        num_packing_bins=spec.packing_bins or rows, seed=spec.seed, shuffle_bins=False)
    it = it.map(_from_packed)
  else:
    it = it.map(PadRow(spec.seq_len, tokenizer.pad_id))
  # The last batch of a finite run is filled with empty rows (segment 0, no loss), so every
  # example is seen and every batch has the same shape.
  return it.batch(rows).map(FillBatch(rows, tokenizer.pad_id))


def _prefetched(it: grain.IterDataset, workers: int) -> grain.IterDataset:
  from absl import flags

  if not flags.FLAGS.is_parsed():  # grain reads its absl flags; cardjax does not use absl's
    flags.FLAGS.mark_as_parsed()
  return it.mp_prefetch(grain.MultiprocessingOptions(num_workers=workers))


def host_datasets(source, tokenizer: Tokenizer, spec: PipelineSpec,
                  process_index: int | None = None, process_count: int | None = None,
                  ) -> tuple[int, dict[int, grain.IterDataset]]:
  """(the run's shard count, {shard: its IterDataset} for the shards this host reads)."""
  spec.validate()
  index, count = host_slice(process_index, process_count)
  if spec.batch_size % count:
    raise CardjaxError(f"data.batch_size={spec.batch_size} is not divisible by the "
                       f"{count} hosts")
  if len(source) == 0:
    raise CardjaxError("the dataset split is empty; check the files the dataset was built "
                       "from (cardjax data show NAME)")
  shards = data_shards.count(spec.shards, count, spec.batch_size)
  mine = data_shards.owned(index, count, shards)
  if isinstance(source, LazySource):  # a bucket build: fetch this host's files only
    ranges = [data_shards.record_range(len(source), s, shards) for s in mine]
    fit_cache(source, ranges, spec.cache_gb)
  datasets = {s: shard_dataset(source, tokenizer, spec, s, shards) for s in mine}
  if spec.num_workers:  # the workers are shared out over this host's shards
    workers = max(1, spec.num_workers // len(mine))
    datasets = {s: _prefetched(ds, workers) for s, ds in datasets.items()}
  return shards, datasets


class HostBatches:
  """This host's batches: the rows of its shards side by side, in shard order (so hosts
  in process order give the global batch). Iterating starts the shards' iterators.
  `shards`: the run's shard count; `owned`: the shards this host reads."""

  def __init__(self, shards: int, datasets: dict[int, grain.IterDataset], pad_id: int):
    self.shards, self.datasets, self.pad_id = shards, datasets, pad_id
    self.owned = list(datasets)

  def __iter__(self) -> "HostIterator":
    return HostIterator({s: iter(ds) for s, ds in self.datasets.items()}, self.pad_id)


class HostIterator:
  def __init__(self, iterators: dict, pad_id: int):
    self.iterators, self.pad_id = iterators, pad_id
    self.finished: set[int] = set()

  def __iter__(self):
    return self

  def __next__(self) -> dict[str, np.ndarray]:
    parts = {}
    for shard, it in self.iterators.items():
      if shard not in self.finished:
        try:
          parts[shard] = next(it)
        except StopIteration:  # a finite run: this shard's epoch is over before another's
          self.finished.add(shard)
    if not parts:
      raise StopIteration
    like = next(iter(parts.values()))
    empty = {k: np.full_like(v, self.pad_id if k == "tokens" else 0) for k, v in like.items()}
    rows = [parts.get(shard, empty) for shard in self.iterators]
    if len(rows) == 1:
      return rows[0]
    return {k: np.concatenate([r[k] for r in rows]) for k in like}

  def get_state(self) -> dict:
    return {str(s): it.get_state() for s, it in self.iterators.items()}

  def set_state(self, state: dict) -> None:
    for shard, it in self.iterators.items():
      it.set_state(state[str(shard)])
      if hasattr(it, "start_prefetch"):
        it.start_prefetch()
      self.finished.discard(shard)

  def close(self) -> None:
    for it in self.iterators.values():
      close = getattr(it, "close", None)
      if close is not None:
        close()


def make_dataset(source, tokenizer: Tokenizer, spec: PipelineSpec,
                 process_index: int | None = None,
                 process_count: int | None = None) -> HostBatches:
  """This host's batches (dicts of [per-host rows, seq_len]), to iterate."""
  return HostBatches(*host_datasets(source, tokenizer, spec, process_index, process_count),
                     tokenizer.pad_id)


def batch_sharding(mesh) -> NamedSharding:
  """Rows over the data-parallel axes (the 'act_batch' rule), sequence replicated."""
  return NamedSharding(mesh, logical_to_spec(("act_batch", "act_seq"), None, dict(mesh.shape)))


def to_global(batch: dict[str, np.ndarray], mesh) -> dict[str, jax.Array]:
  """Per-host rows -> global arrays [batch_size, seq_len] sharded over the mesh."""
  sharding = batch_sharding(mesh)
  return {k: jax.make_array_from_process_local_data(sharding, v) for k, v in batch.items()}


_LIVE: "weakref.WeakSet[DataLoader]" = weakref.WeakSet()


@atexit.register
def _close_live_loaders() -> None:
  # grain's worker buffers must be released before the interpreter tears modules down,
  # or every open loader prints shutdown tracebacks.
  for loader in list(_LIVE):
    loader.close()


class DataLoader:
  """Iterate global batches; `get_state()` / `set_state()` resume exactly; `close()` stops
  the grain workers (also done at exit and by `with DataLoader(...) as loader:`)."""

  def __init__(self, source, tokenizer: Tokenizer, spec: PipelineSpec, mesh=None,
               process_index: int | None = None, process_count: int | None = None):
    self.spec, self.mesh = spec, mesh
    if mesh is not None:
      axes = batch_sharding(mesh).spec[0] or ()
      axes = (axes,) if isinstance(axes, str) else tuple(axes)
      rows = int(np.prod([mesh.shape[a] for a in axes]))
      if spec.batch_size % rows:
        raise CardjaxError(
            f"data.batch_size={spec.batch_size} does not split over the {rows} devices that "
            f"hold batch rows (mesh axes {' x '.join(axes)}); use a multiple of {rows}")
    self.dataset = make_dataset(source, tokenizer, spec, process_index, process_count)
    self.shards, self.owned = self.dataset.shards, self.dataset.owned
    self._it = iter(self.dataset)
    _LIVE.add(self)

  def close(self) -> None:
    if self._it is not None:
      close = getattr(self._it, "close", None)
      if close is not None:
        close()
      self._it = None  # freed now, while the modules its __del__ needs still exist
      gc.collect()
    _LIVE.discard(self)

  def __enter__(self):
    return self

  def __exit__(self, *exc):
    self.close()

  def __iter__(self):
    return self

  def __next__(self) -> dict[str, Any]:
    batch = next(self._it)
    if self.spec.num_workers:
      # Copy out of grain's shared memory, whose buffers cannot outlive the interpreter.
      batch = {k: np.array(v) for k, v in batch.items()}
    return to_global(batch, self.mesh) if self.mesh is not None else batch

  def checkpoint_save(self):
    """The orbax save argument of the iterator: every process writes the state files of
    its shards (shard_S-of-V.json), so a run resumes on any host count dividing V."""
    return data_shards.ShardStateSave(self)

  def checkpoint_restore(self):
    return data_shards.ShardStateRestore(self)

  def shard_states(self) -> dict[int, dict]:
    return {int(s): state for s, state in self._it.get_state().items()}

  def set_shard_states(self, states: dict[int, dict]) -> None:
    self._it.set_state({str(s): state for s, state in states.items()})

  def get_state(self) -> dict:
    return self._it.get_state()

  def set_state(self, state: dict) -> None:
    self._it.set_state(state)
