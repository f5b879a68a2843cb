"""Data shards: the units in which a run's training data is read, resumed and dealt to
hosts.

A split's records are cut into V contiguous ranges (data.shards; 0 = one per process when
the run starts). Each shard is a pipeline of its own: its range shuffled each epoch with its
own seed, tokenized, split, packed and batched into batch_size / V rows. Host i of N reads
shards i V/N to (i+1) V/N - 1 and lays their rows side by side, so the global batch of every
step is the same whichever N (dividing V) reads it. The iterator state is one file per
shard (shard_S-of-V.json in a checkpoint's `data` item): a run saved on N hosts resumes on
any M that divides V, each new host taking up its shards where they were, so no row is read
twice or skipped. Contiguous ranges also keep a host inside its part of a bucket build: it
fetches those shard files only.

One shard on one process is exactly the pipeline of a single-process run before shards
existed, and such a run's `process_0-of-1.json` state restores into it.
"""

from __future__ import annotations

import dataclasses
import json
import re
from typing import Any

from cardjax.errors import CardjaxError, CheckpointError

STATE_FILE = "shard_{shard}-of-{shards}.json"
_STATE = re.compile(r"shard_(\d+)-of-(\d+)\.json$")
_OLD_STATE = re.compile(r"process_(\d+)-of-(\d+)\.json$")  # grain's per-process files


def count(requested: int, process_count: int, batch_size: int) -> int:
  """V for a run: data.shards, or one per process; it must split hosts and rows evenly."""
  shards = requested or process_count
  if shards < 1:
    raise CardjaxError(f"data.shards={requested}: must be >= 0 (0 = one per process)")
  if shards % process_count:
    raise CardjaxError(f"data.shards={shards} cannot be dealt to {process_count} hosts; use "
                       f"a multiple of the host count (this run's data is read in {shards} "
                       f"shards, so it runs on {hosts_for(shards)} hosts)")
  if batch_size % shards:
    raise CardjaxError(f"data.batch_size={batch_size} is not divisible by data.shards="
                       f"{shards} (each shard gives batch_size / shards rows a step)")
  return shards


def hosts_for(shards: int) -> str:
  """The host counts a run of `shards` shards can run on, for messages."""
  return ", ".join(str(n) for n in range(1, shards + 1) if shards % n == 0)


def owned(process_index: int, process_count: int, shards: int) -> range:
  per_host = shards // process_count
  return range(process_index * per_host, (process_index + 1) * per_host)


def record_range(records: int, shard: int, shards: int) -> tuple[int, int]:
  """The records [lo, hi) of `shard`: contiguous, sizes differing by at most one."""
  if records < shards:
    raise CardjaxError(f"the split has {records} records, fewer than its {shards} data "
                       "shards; lower data.shards or use a larger split")
  return records * shard // shards, records * (shard + 1) // shards


def saved_count(names: list[str]) -> int | None:
  """V of a checkpoint's data item from its file names (None: no state files)."""
  for name in names:
    for pattern in (_STATE, _OLD_STATE):
      match = pattern.search(name)
      if match:
        return int(match.group(2))
  return None


def _read(directory, shard: int, shards: int) -> dict:
  path = directory / STATE_FILE.format(shard=shard, shards=shards)
  if not path.exists() and shards == 1:  # a single-process run from before shards
    path = directory / "process_0-of-1.json"
  if not path.exists():
    names = sorted(p.name for p in directory.iterdir())
    raise CheckpointError(f"{directory} has no data state for shard {shard} of {shards} "
                          f"(it holds {names}); a run of several hosts written before data "
                          "shards resumes only on the same hosts with the cardjax that wrote it")
  return json.loads(path.read_text())


class ShardStateHandler:
  """The orbax handler of a DataLoader's `data` item: each process writes and reads the
  state files of the shards it holds."""

  def save(self, directory, item=None, args=None):
    loader = item or args.item
    for shard, state in loader.shard_states().items():
      name = STATE_FILE.format(shard=shard, shards=loader.shards)
      (directory / name).write_text(json.dumps(state, indent=1))

  def restore(self, directory, item=None, args=None):
    loader = item or args.item
    loader.set_shard_states({s: _read(directory, s, loader.shards) for s in loader.owned})
    return loader

  def structure(self, directory) -> Any:
    return None

  def metadata(self, directory) -> Any:
    return None

  def finalize(self, directory) -> None:
    pass

  def close(self) -> None:
    pass

  @classmethod
  def typestr(cls) -> str:
    return f"{cls.__module__}.{cls.__qualname__}"


import orbax.checkpoint as ocp  # noqa: E402  (the handler above is what these register)


@ocp.args.register_with_handler(ShardStateHandler, for_save=True)
@dataclasses.dataclass
class ShardStateSave(ocp.args.CheckpointArgs):
  item: Any


@ocp.args.register_with_handler(ShardStateHandler, for_restore=True)
@dataclasses.dataclass
class ShardStateRestore(ocp.args.CheckpointArgs):
  item: Any
