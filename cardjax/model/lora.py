"""The LoRA adapter module on the decoder's projections, and the merge of its weights.

An adapted projection computes W x + (alpha / r) B(A(drop(x))), A [in, r] and B [r, out]
held by flax NNX's own `nnx.LoRA` (its parameters are `nnx.LoRAParam`, so
`nnx.split(model, nnx.LoRAParam, nnx.Param)` separates the trainable adapters from the
frozen base). B starts at zero, so an adapted model starts as its base, token for token.
Projections keep cardjax's head-structured shapes ([embed, heads, head_dim] ...); the adapter
works on their flattened in/out sizes and `merged_state` folds (alpha / r) A B back into
each weight, which is what export and inference use.
"""

from __future__ import annotations

import math

import jax
import jax.numpy as jnp
from flax import nnx

from cardjax.model.lora_spec import TARGETS, LoraSpec

# Folded into a row's key so dropout masks never repeat the corruption draws of that row.
_DROPOUT_STREAM = 0x10A


class Adapter(nnx.Module):
  """(alpha / r) B A drop(x) for x [..., in_size] -> [..., out_size]."""

  def __init__(self, in_size: int, out_size: int, spec: LoraSpec, site: int, dtype,
               param_dtype, rngs: nnx.Rngs, in_axis: str | None = None,
               out_axis: str | None = None):
    # A is sharded like its input's embed axis where it has one; the rest is small enough
    # to replicate (rank r columns).
    self.lora = nnx.LoRA(in_size, spec.rank, out_size, dtype=dtype, param_dtype=param_dtype,
                         rngs=rngs, a_metadata={"logical_axes": (in_axis, None)},
                         b_metadata={"logical_axes": (None, out_axis)})
    self.scale = spec.scale
    self.dropout = spec.dropout
    self.site = site

  def __call__(self, x, keys=None):
    """keys: one key per row of x (the trainer's; None = no dropout, as at inference)."""
    if keys is not None and self.dropout > 0.0:
      def mask(key):
        key = jax.random.fold_in(jax.random.fold_in(key, _DROPOUT_STREAM), self.site)
        return jax.random.bernoulli(key, 1.0 - self.dropout, x.shape[1:])
      x = jnp.where(jax.vmap(mask)(keys), x / (1.0 - self.dropout), 0).astype(x.dtype)
    return self.lora(x) * jnp.asarray(self.scale, x.dtype)


def adapter(spec: LoraSpec | None, name: str, in_size: int, out_size: int, cfg,
            rngs: nnx.Rngs, in_axis: str | None = None, out_axis: str | None = None):
  """The Adapter of projection `name`, or None when spec does not target it."""
  if spec is None or name not in spec.targets:
    return None
  return Adapter(in_size, out_size, spec, TARGETS.index(name), jnp.dtype(cfg.dtype),
                 jnp.dtype(cfg.param_dtype), rngs, in_axis, out_axis)


def layer_keys(keys, index):
  """Each row's key folded with a layer (or site) index; None stays None."""
  if keys is None:
    return None
  return jax.vmap(lambda k: jax.random.fold_in(k, index))(keys)


def merged_state(base: dict, adapters: dict, spec: LoraSpec) -> dict:
  """The base's pure-dict state with (alpha / r) A B added to every adapted weight.

  Adapters sit beside their weight: `attn.q_lora.lora.{lora_a,lora_b}` adapts `attn.q`;
  a scanned model's leading layer axis is a batch axis of the matmul."""
  out = {}
  for key, value in base.items():
    out[key] = merged_state(value, adapters.get(key, {}), spec) if isinstance(value, dict) \
        else value
  for key, sub in adapters.items():
    if not (isinstance(key, str) and key.endswith("_lora")):
      continue
    name = key[:-len("_lora")]
    a, b = sub["lora"]["lora_a"], sub["lora"]["lora_b"]
    weight = out[name]
    delta = jnp.matmul(a.astype(jnp.float32), b.astype(jnp.float32)) * spec.scale
    out[name] = (weight.astype(jnp.float32) + delta.reshape(weight.shape)).astype(weight.dtype)
  return out


def count(tree) -> int:
  """Parameters in a (pure-dict or State) tree."""
  return sum(math.prod(x.shape) for x in jax.tree.leaves(tree))


def nbytes(tree) -> int:
  """Bytes of every array leaf of a tree (e.g. an optimizer state)."""
  return sum(math.prod(x.shape) * jnp.dtype(x.dtype).itemsize for x in jax.tree.leaves(tree)
             if hasattr(x, "dtype"))
