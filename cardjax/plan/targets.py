"""The machines `cardjax plan` compiles for: TPU slices by their Cloud names, GPU nodes as N x KIND.

TPU names follow Google Cloud's accelerator types: v4-N and v5p-N count TensorCores (two per
chip, so v5p-64 is 32 chips), v5e-N (also v5litepod-N) and v6e-N count chips. They compile
on compile-only devices from libtpu (`jax.experimental.topologies`), no TPU needed: real
TPU memory plans. GPU nodes (8xH200, 8xH100, 8xA100) compile on simulated CPU devices:
XLA:CPU's memory plan of the same program, an estimate (another compiler, no GPU fusions).
"""

from __future__ import annotations

import dataclasses
import os
import re
import sys

from cardjax.errors import CardjaxError
from cardjax.peaks import peak_flops_for_kind

# Where `make install` puts libtpu: beside the venv, so that only plan processes see it.
LIBTPU_DIR = os.environ.get("CARDJAX_LIBTPU_DIR") or os.path.join(sys.prefix, "libtpu-plan")

GIB = 1 << 30
# Per chip: HBM bytes, whether the Cloud name counts TensorCores, and whether the torus is
# 3-D. Peak FLOP/s come from cardjax.peaks (the trainer's MFU table).
TPU_CHIPS = {
    "v4": (32 * GIB, True, True),
    "v5p": (95 * GIB, True, True),
    "v5e": (16 * GIB, False, False),
    "v6e": (32 * GIB, False, False),
}
TPU_ALIASES = {"v5litepod": "v5e", "v5lite": "v5e", "v6": "v6e"}
# libtpu's names for the compile-only topologies.
LIBTPU_NAME = {"v4": "v4", "v5p": "v5", "v5e": "v5e", "v6e": "v6e"}
# Per GPU: memory as nvidia-smi reports it.
GPUS = {"H200": 143771 << 20, "H100": 81559 << 20, "A100": 81920 << 20}


@dataclasses.dataclass(frozen=True)
class Target:
  name: str  # as the user wrote it
  platform: str  # "tpu" | "gpu"
  chip: str  # v5p, H200, ...
  chips: int
  hbm_per_chip: int  # bytes
  peak_per_chip: float  # FLOP/s, dense bf16
  libtpu_topology: str = ""  # e.g. "v5:2x4x4" (one slice); "" for GPUs
  slices: int = 1  # TPU slices over DCN (chips counts them all)

  @property
  def estimate(self) -> bool:
    """True where the memory plan is XLA:CPU's stand-in, not the target's own compiler."""
    return self.platform == "gpu"


def _torus(chips: int, dims: int) -> str:
  """Cloud's slice shape for `chips`: doublings dealt to the sides in turn, written
  smallest side first (v5p-64: 2x4x4, v6e-32: 4x8), except a 3-D slice with a side of 1
  (v5p-8: 2x2x1)."""
  if chips < 1 or chips & (chips - 1):
    raise CardjaxError(f"{chips} chips: a slice has a power-of-two number of chips")
  shape = [1] * dims
  for i in range(chips.bit_length() - 1):
    shape[i % dims] *= 2
  shape.sort(reverse=dims == 3 and 1 in shape)
  return "x".join(map(str, shape))


def parse_target(name: str) -> Target:
  """Target from 'v5p-64', 'v5e-16', 'v6e-8', 'v4-32', '8xH200', ... (one clear error)."""
  text = name.strip()
  gpu = re.fullmatch(r"(\d+)\s*[xX]\s*([A-Za-z]\d+)", text)
  if gpu:
    count, kind = int(gpu.group(1)), gpu.group(2).upper()
    if kind not in GPUS or count < 1:
      raise CardjaxError(f"topology {name!r}: unknown GPU {kind!r}; use N x one of "
                         f"{sorted(GPUS)} (e.g. 8xH200)")
    return Target(text, "gpu", kind, count, GPUS[kind], peak_flops_for_kind(kind))
  tpu = re.fullmatch(r"(?:(\d+)x)?(v\d+[a-z]*)-(\d+)", text.lower())
  if not tpu:
    raise CardjaxError(f"topology {name!r} is not a TPU slice (v4-N, v5p-N, v5e-N, v6e-N; "
                       "2xv5p-64 for two slices over DCN) or a GPU node (NxH200, NxH100, "
                       "NxA100)")
  slices = int(tpu.group(1) or 1)
  kind, count = TPU_ALIASES.get(tpu.group(2), tpu.group(2)), int(tpu.group(3))
  if slices < 1:
    raise CardjaxError(f"topology {name!r}: the number of slices must be >= 1")
  if kind not in TPU_CHIPS:
    raise CardjaxError(f"topology {name!r}: unknown TPU generation {tpu.group(2)!r}; use one "
                       f"of {sorted(TPU_CHIPS)}")
  hbm, counts_cores, three_d = TPU_CHIPS[kind]
  chips = count // 2 if counts_cores else count
  if chips < 1 or (counts_cores and count % 2):
    raise CardjaxError(f"topology {name!r}: {kind}-N counts TensorCores, two per chip; N must "
                       "be even")
  shape = _torus(chips, 3 if three_d else 2)
  return Target(text, "tpu", kind, chips * slices, hbm, peak_flops_for_kind(f"tpu {kind}"),
                f"{LIBTPU_NAME[kind]}:{shape}", slices)


def add_libtpu_path() -> bool:
  """Point jax at the libtpu in LIBTPU_DIR (before jax starts: it looks for libtpu once), by
  TPU_LIBRARY_PATH, the variable jax reads first and `import libtpu` itself sets: the
  library, not the folder, so nothing else in LIBTPU_DIR becomes importable. True when jax
  will find a libtpu (this one, or one installed in the environment)."""
  import importlib.util

  library = os.path.join(LIBTPU_DIR, "libtpu", "libtpu.so")
  if os.path.isfile(library):
    os.environ.setdefault("TPU_LIBRARY_PATH", library)
  # libtpu takes a machine-wide lock file unless told otherwise: compile-only plans drive no
  # TPU, so two of them (or a plan beside a test) may load it at once.
  os.environ.setdefault("ALLOW_MULTIPLE_LIBTPU_LOAD", "1")
  return (os.path.isfile(os.environ.get("TPU_LIBRARY_PATH", ""))
          or importlib.util.find_spec("libtpu") is not None)


def target_devices(target: Target) -> list:
  """The devices to compile for: libtpu's compile-only devices, or the simulated CPU ones."""
  import jax

  if target.platform == "tpu":
    try:
      from jax.experimental import topologies
      devices = topologies.get_topology_desc(target.libtpu_topology, "tpu",
                                             num_slices=target.slices).devices
    except Exception as e:  # libtpu missing, or an older one without this topology
      raise CardjaxError(
          f"cannot make compile-only TPU devices for {target.name} ({target.libtpu_topology}):"
          f" {str(e).splitlines()[0][:200]}; `make install` puts libtpu (the version jax pins) in "
          f"{LIBTPU_DIR}, or set CARDJAX_LIBTPU_DIR to a `pip install --target` folder of "
          "it") from None
    return list(devices)
  devices = jax.devices("cpu")
  if len(devices) < target.chips:
    raise CardjaxError(
        f"{target.name} is simulated on {target.chips} CPU devices but jax has {len(devices)};"
        f" set XLA_FLAGS=--xla_force_host_platform_device_count={target.chips} before jax "
        "starts (the `cardjax plan` command does)")
  return devices[:target.chips]
