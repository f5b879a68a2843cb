"""Build the (data, fsdp, tensor) device mesh from the config's `mesh` section."""

from __future__ import annotations

import math

import jax
from jax.sharding import AxisType

from cardjax.errors import ConfigError
from cardjax.parallel.sharding import MESH_AXES


def mesh_shape(data: int = 1, fsdp: int = -1, tensor: int = 1, num_devices: int | None = None):
  """Resolve one -1 entry to the devices left over; check the product."""
  n = jax.device_count() if num_devices is None else num_devices
  sizes = {"data": data, "fsdp": fsdp, "tensor": tensor}
  free = [k for k, v in sizes.items() if v == -1]
  if len(free) > 1:
    raise ConfigError(f"mesh: at most one axis may be -1, got {sizes}")
  for k, v in sizes.items():
    if v == 0 or v < -1:
      raise ConfigError(f"mesh.{k}={v}: use a positive size or -1 (fill)")
  fixed = math.prod(v for v in sizes.values() if v != -1)
  if free:
    if n % fixed:
      raise ConfigError(f"mesh {sizes}: {n} devices are not divisible by {fixed}")
    sizes[free[0]] = n // fixed
  if math.prod(sizes.values()) != n:
    raise ConfigError(f"mesh {sizes} needs {math.prod(sizes.values())} devices, "
                      f"but {n} are available; set one axis to -1 to fill")
  return tuple(sizes[a] for a in MESH_AXES)


def make_mesh(data: int = 1, fsdp: int = -1, tensor: int = 1, devices=None, slices: int = 1):
  """A mesh with Auto axes (XLA propagates shardings we do not pin). With slices > 1 the
  devices are TPU slices joined over the data-center network: the data axis is laid across
  slices (only gradients cross DCN), fsdp and tensor inside each slice's ICI."""
  devices = jax.devices() if devices is None else devices
  shape = mesh_shape(data, fsdp, tensor, len(devices))
  axis_types = (AxisType.Auto,) * len(MESH_AXES)
  if slices == 1:
    return jax.make_mesh(shape, MESH_AXES, axis_types=axis_types, devices=devices)
  if slices < 1 or shape[0] % slices:
    raise ConfigError(f"mesh.data={shape[0]} must be a multiple of mesh.slices={slices} (the "
                      "data axis spans the slices); set mesh.data to a multiple")
  found = {getattr(d, "slice_index", None) for d in devices}
  if len(found) != slices:
    raise ConfigError(f"mesh.slices={slices} but the devices come from {len(found)} "
                      f"slice(s) (slice_index {sorted(found, key=str)})")
  from jax.experimental import mesh_utils

  ici = (shape[0] // slices,) + tuple(shape[1:])
  dcn = (slices,) + (1,) * (len(shape) - 1)
  grid = mesh_utils.create_hybrid_device_mesh(ici, dcn, devices)
  return jax.sharding.Mesh(grid, MESH_AXES, axis_types=axis_types)


def local_mesh():
  """All local devices on the fsdp axis, or None on one device: the commands that load or
  write a whole model (init, import-hf, import-gguf, export-hf) shard a large one over every
  device and replicate a small one."""
  return make_mesh(1, -1, 1) if jax.device_count() > 1 else None
