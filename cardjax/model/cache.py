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
# Slots sit next to head_dim ([.., kv_heads, slots, head_dim]): that is the operand layout of
# the attention matmuls, so a forward reads the cache where it lies instead of transposing
# every layer's keys and values into it first (on CPU that copy cost more than the matmuls).
KV_AXES = ("layers", "act_batch", "act_kv_heads", "act_seq", "head_dim")
META_AXES = ("act_batch", "act_seq")

EMPTY_SEGMENT = -1


@jax.tree_util.register_dataclass
@dataclasses.dataclass
class KVCache:
  k: jax.Array  # [layers, batch, kv_heads, slots, head_dim]
  v: jax.Array
  positions: jax.Array  # [batch, slots] int32
  streams: jax.Array  # [batch, slots] int32
  segments: jax.Array  # [batch, slots] int32, EMPTY_SEGMENT where nothing is written
  # int32: the next slot to write; a scalar (every row writes the same slots) or [batch]
  # (each row its own: see per_row).
  index: jax.Array

  @classmethod
  def create(cls, cfg: ModelConfig, batch: int, slots: int, dtype=None) -> "KVCache":
    dtype = jnp.dtype(dtype or cfg.dtype)
    shape = (cfg.num_layers, batch, cfg.num_kv_heads, slots, cfg.resolved_head_dim)
    meta = constrain(jnp.zeros((batch, slots), jnp.int32), META_AXES)
    zeros = constrain(jnp.zeros(shape, dtype), KV_AXES)
    return cls(k=zeros, v=zeros, positions=meta, streams=meta,
               segments=constrain(meta + EMPTY_SEGMENT, META_AXES), index=jnp.int32(0))

  @property
  def slots(self) -> int:
    return self.k.shape[3]

  def per_row(self) -> "KVCache":
    """The cache with one write index per row, all at the shared one. Rows that commit
    different numbers of tokens per forward (MARS) then keep their slots packed instead of
    all advancing by the longest row: fewer slots for every forward's attention to read."""
    b = self.segments.shape[0]
    return dataclasses.replace(self, index=jnp.broadcast_to(self.index, (b,)))

  def forget_scratch(self, n: int) -> "KVCache":
    """The cache with the n slots from each row's (per-row) index marked empty: scratch
    written by a window that a narrower next window will not overwrite must not stay
    visible, since attention decides visibility by position and segment, not by slot.
    Slots past the end are dropped."""
    rows = jnp.arange(self.segments.shape[0])[:, None]
    at = self.index[:, None] + jnp.arange(n)[None]
    return dataclasses.replace(
        self, segments=self.segments.at[rows, at].set(EMPTY_SEGMENT, mode="drop"))

  def write_meta(self, meta) -> "KVCache":
    """The cache with the new tokens' metadata at [index, index + t)."""
    pos, streams, seg = meta
    return dataclasses.replace(self, positions=write_slots(self.positions, pos, self.index),
                               streams=write_slots(self.streams, streams, self.index),
                               segments=write_slots(self.segments, seg, self.index))

  def key_meta(self):
    return self.positions, self.streams, self.segments


def write_slots(buf, new, index, layer=None):
  """buf with `new` written over t slots from `index` (a scalar, or one per row).

  buf: [batch, slots] metadata with new [batch, t]; or, with `layer`, a whole cache array
  [layers, batch, kv_heads, slots, head_dim] with new [batch, kv_heads, t, head_dim] for
  that layer. A shared index (or a per-row one of a single row) is a dynamic_update_slice,
  a per-row one a scatter; both update the loop-carried buffer in place. Every caller
  sizes the cache so that its writes stay inside it (a slice would be moved back inside,
  a scatter's stray rows dropped)."""
  t = new.shape[-2] if layer is not None else new.shape[-1]
  if jnp.ndim(index) == 1 and index.shape[0] == 1:
    # One row: its index is the shared one. A slice write fuses with the update that
    # feeds it; a scatter takes an index array and an update of its own, three more
    # kernels a layer, which at batch 1 cost as much as the layer's own small matmuls.
    index = index[0]
  if jnp.ndim(index) == 0:
    if layer is None:
      return jax.lax.dynamic_update_slice(buf, new, (0, index))
    return jax.lax.dynamic_update_slice(buf, new[None], (layer, 0, 0, index, 0))
  rows = jnp.arange(new.shape[0])[:, None]
  slots = index[:, None] + jnp.arange(t)[None]
  if layer is None:
    return buf.at[rows, slots].set(new)
  # Advanced indices split by a slice put their [batch, t] dims first: new as [b, t, kv, d].
  return buf.at[layer, rows, :, slots].set(new.transpose(0, 2, 1, 3))
