"""Read and write (optionally sharded) safetensors folders the way transformers lays them out."""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Iterable

import numpy as np
from safetensors import safe_open
from safetensors.numpy import save_file

from cardjax.errors import CheckpointError

SINGLE = "model.safetensors"
INDEX = "model.safetensors.index.json"


class SafetensorsReader:
  """Tensors by key from `model.safetensors` or the shards named in its index."""

  def __init__(self, directory: str | Path):
    self.directory = Path(directory)
    index = self.directory / INDEX
    if index.is_file():
      try:
        weight_map = json.loads(index.read_text())["weight_map"]
        if not isinstance(weight_map, dict):
          raise TypeError("weight_map is not an object")
      except (json.JSONDecodeError, KeyError, TypeError) as e:
        raise CheckpointError(f"{index} is not a safetensors index ({e}); it needs "
                              '{"weight_map": {tensor: file}}') from None
    elif (self.directory / SINGLE).is_file():
      weight_map = None
    else:
      found = sorted(p.name for p in self.directory.iterdir())
      hint = (" (pytorch .bin weights are never unpickled: convert them to safetensors)"
              if any(n.endswith(".bin") for n in found) else "")
      raise CheckpointError(f"no weights in {self.directory}: expected {SINGLE} or {INDEX}"
                            f"{hint}; found {found}")
    self._handles: dict[str, object] = {}
    if weight_map is None:
      handle = self._open(SINGLE)
      self.weight_map = {k: SINGLE for k in handle.keys()}
    else:
      self.weight_map = dict(weight_map)

  def _open(self, filename: str):
    if filename not in self._handles:
      path = self.directory / filename
      if not path.is_file():
        raise CheckpointError(f"{path} is named in {INDEX} but does not exist")
      try:
        self._handles[filename] = safe_open(str(path), framework="numpy")
      except Exception as e:  # safetensors raises its own error types for bad headers
        raise CheckpointError(f"{path} is not a readable safetensors file: {e}") from None
    return self._handles[filename]

  def keys(self) -> list[str]:
    return list(self.weight_map)

  def __contains__(self, key: str) -> bool:
    return key in self.weight_map

  def get(self, key: str) -> np.ndarray:
    if key not in self.weight_map:
      raise CheckpointError(f"tensor {key!r} is missing from {self.directory}")
    handle = self._open(self.weight_map[key])
    if key not in handle.keys():
      raise CheckpointError(f"{INDEX} maps tensor {key!r} to {self.file_of(key)}, which does "
                            "not hold it; the index and the shards disagree")
    return handle.get_tensor(key)

  def file_of(self, key: str) -> str:
    return str(self.directory / self.weight_map[key])


def write_safetensors(directory: str | Path, tensors: Iterable[tuple[str, np.ndarray]],
                      max_shard_bytes: int = 5 * 2**30) -> list[str]:
  """Write tensors into shards of at most `max_shard_bytes`, plus an index when >1 shard.

  Files are written under temporary names and renamed at the end, so an interrupted export
  never leaves a folder that looks complete.
  """
  directory = Path(directory)
  directory.mkdir(parents=True, exist_ok=True)
  shards: list[dict[str, np.ndarray]] = [{}]
  sizes = [0]
  for key, array in tensors:
    array = np.ascontiguousarray(array)
    if sizes[-1] and sizes[-1] + array.nbytes > max_shard_bytes:
      shards.append({})
      sizes.append(0)
    shards[-1][key] = array
    sizes[-1] += array.nbytes
  n = len(shards)
  names = [SINGLE] if n == 1 else [f"model-{i + 1:05d}-of-{n:05d}.safetensors" for i in range(n)]
  for name, shard in zip(names, shards):
    save_file(shard, str(directory / (name + ".tmp")), metadata={"format": "pt"})
  if n > 1:
    index = {"metadata": {"total_size": int(sum(sizes))},
             "weight_map": {k: name for name, shard in zip(names, shards) for k in shard}}
    (directory / (INDEX + ".tmp")).write_text(json.dumps(index, indent=2, sort_keys=True))
  # Weights of an earlier export into this folder must go: transformers and cardjax would
  # otherwise pick different files (model.safetensors vs the index) from one folder.
  for stale in [directory / SINGLE, directory / INDEX,
                *directory.glob("model-*-of-*.safetensors")]:
    if stale.name not in names and stale.exists():
      stale.unlink()
  for name in names:
    os.replace(directory / (name + ".tmp"), directory / name)
  if n > 1:
    os.replace(directory / (INDEX + ".tmp"), directory / INDEX)
  return names
