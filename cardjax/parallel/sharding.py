"""Logical axis names -> mesh axes, through one rules table.

Parameters and activations name their dimensions logically ('embed', 'heads', 'act_batch').
The rules table maps each name to mesh axes (data, fsdp, tensor). A dimension whose size
the mesh axes do not divide keeps the longest prefix of them that does, or is replicated
(e.g. one kv head on tensor=2), so any model runs on any mesh; the per-parameter result can
be read off `param_shardings`.
"""

from __future__ import annotations

import contextlib
import math
from typing import Iterator, Sequence

import jax
from jax.sharding import NamedSharding, PartitionSpec

MESH_AXES = ("data", "fsdp", "tensor")

# (logical name, mesh axis or axes or None). Parameters shard over fsdp (ZeRO-3 style) and
# tensor; activations shard their batch over data x fsdp and their heads/mlp over tensor.
DEFAULT_RULES: tuple[tuple[str, object], ...] = (
    ("vocab", "tensor"),
    ("embed", "fsdp"),
    ("heads", "tensor"),
    ("kv_heads", "tensor"),
    ("head_dim", None),
    ("mlp", "tensor"),
    ("layers", None),
    ("act_batch", ("data", "fsdp")),
    ("act_seq", None),
    ("act_embed", None),
    ("act_heads", "tensor"),
    ("act_kv_heads", "tensor"),
    ("act_mlp", "tensor"),
    ("act_vocab", "tensor"),
)

_rules: list[tuple[tuple[str, object], ...]] = [DEFAULT_RULES]


@contextlib.contextmanager
def use_rules(rules: Sequence[Sequence]) -> Iterator[None]:
  """Use another rules table inside the block (the config's `mesh.rules`)."""
  _rules.append(tuple((name, _as_axes(axes)) for name, axes in rules))
  try:
    yield
  finally:
    _rules.pop()


def current_rules() -> tuple[tuple[str, object], ...]:
  return _rules[-1]


def _as_axes(axes):
  if axes is None or isinstance(axes, str):
    return axes
  return tuple(axes)


def logical_to_spec(names: Sequence[str | None], shape: Sequence[int] | None = None,
                    mesh_shape: dict | None = None, rules=None) -> PartitionSpec:
  """The PartitionSpec for logically named dims; indivisible or reused axes replicate."""
  table = dict(rules if rules is not None else current_rules())
  used: set[str] = set()
  spec = []
  for i, name in enumerate(names):
    if name is not None and name not in table:
      raise ValueError(f"logical axis {name!r} has no sharding rule; add it to mesh.rules")
    axes = table.get(name) if name is not None else None
    axes = (axes,) if isinstance(axes, str) else tuple(axes or ())
    axes = tuple(a for a in axes if a not in used)
    if mesh_shape is not None:
      axes = tuple(a for a in axes if a in mesh_shape)
      if shape is not None:
        # The longest prefix of the axes whose product divides the dimension: batch 2 on
        # data=2 x fsdp=2 still splits over data.
        while axes and shape[i] % math.prod(mesh_shape[a] for a in axes):
          axes = axes[:-1]
    used.update(axes)
    spec.append(None if not axes else axes[0] if len(axes) == 1 else axes)
  return PartitionSpec(*spec)


def constrain(x, names: Sequence[str | None]):
  """with_sharding_constraint by logical names; a no-op when no mesh is set."""
  mesh = jax.sharding.get_abstract_mesh()
  if mesh.empty:
    return x
  spec = logical_to_spec(names, x.shape, dict(mesh.shape))
  return jax.lax.with_sharding_constraint(x, spec)


def param_axes(variable) -> tuple[str | None, ...]:
  """Logical axes of an nnx Variable; stacked (scanned) layers gain a leading 'layers'."""
  axes = tuple(variable.get_metadata().get("logical_axes", ()))
  ndim = len(variable.get_value().shape)
  if len(axes) == ndim - 1:
    axes = ("layers",) + axes
  if len(axes) != ndim:
    axes = (None,) * ndim
  return axes


def param_shardings(abstract_state, mesh):
  """A NamedSharding for every Variable of an (abstract) nnx.State."""
  import flax.nnx as nnx

  mesh_shape = dict(mesh.shape)

  def one(variable):
    spec = logical_to_spec(param_axes(variable), variable.get_value().shape, mesh_shape)
    return variable.replace(NamedSharding(mesh, spec))

  return jax.tree.map(one, abstract_state, is_leaf=lambda x: isinstance(x, nnx.Variable))
