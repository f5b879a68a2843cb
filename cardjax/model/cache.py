"""The KV cache: keys and values of every layer for a fixed number of slots.

Slots are written in order at `index` (all rows share it; rows with shorter prompts are
left-padded with segment 0, which no real query can see). The slots' own metadata
(positions, streams, segments) is kept so the one mask predicate decides visibility for
cached keys exactly as for fresh ones: empty slots have segment -1 and are never visible.
"""

from __future__ import annotations

import dataclasses

import jax
import jax.numpy as jnp

from cardjax.model.config import ModelConfig
from cardjax.parallel.sharding import constrain

# Under a mesh (jax.set_mesh) the cache is laid out like the activations that fill it: rows
# over the data axes, kv heads over tensor, so a batched decode never gathers the cache.
KV_AXES = ("layers", "act_batch", "act_seq", "act_kv_heads", "head_dim")
META_AXES = ("act_batch", "act_seq")

EMPTY_SEGMENT = -1


@jax.tree_util.register_dataclass
@dataclasses.dataclass
class KVCache:
  k: jax.Array  # [layers, batch, slots, kv_heads, head_dim]
  v: jax.Array
  positions: jax.Array  # [batch, slots] int32
  streams: jax.Array  # [batch, slots] int32
  segments: jax.Array  # [batch, slots] int32, EMPTY_SEGMENT where nothing is written
  index: jax.Array  # int32 scalar: the next slot to write

  @classmethod
  def create(cls, cfg: ModelConfig, batch: int, slots: int, dtype=None) -> "KVCache":
    dtype = jnp.dtype(dtype or cfg.dtype)
    shape = (cfg.num_layers, batch, slots, cfg.num_kv_heads, cfg.resolved_head_dim)
    meta = constrain(jnp.zeros((batch, slots), jnp.int32), META_AXES)
    zeros = constrain(jnp.zeros(shape, dtype), KV_AXES)
    return cls(k=zeros, v=zeros, positions=meta, streams=meta,
               segments=constrain(meta + EMPTY_SEGMENT, META_AXES), index=jnp.int32(0))

  @property
  def slots(self) -> int:
    return self.k.shape[2]

  def write_meta(self, meta) -> "KVCache":
    """The cache with the new tokens' metadata at [index, index + t)."""
    at = (0, self.index)
    pos, streams, seg = meta
    return dataclasses.replace(
        self, positions=jax.lax.dynamic_update_slice(self.positions, pos, at),
        streams=jax.lax.dynamic_update_slice(self.streams, streams, at),
        segments=jax.lax.dynamic_update_slice(self.segments, seg, at))

  def key_meta(self):
    return self.positions, self.streams, self.segments
