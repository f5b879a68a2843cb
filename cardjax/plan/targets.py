"""The machines `cardjax plan` compiles for: TPU slices by their Cloud names, GPU nodes as N x KIND.

TPU names follow Google Cloud's accelerator types: v4-N and v5p-N count TensorCores (two per
chip, so v5p-64 is 32 chips), v5e-N (also v5litepod-N) and v6e-N count chips. They compile
on compile-only devices from libtpu (`jax.experimental.topologies`), no TPU needed: real
TPU memory plans.

GPU nodes (1xH100 ... 8xH200, several nodes as multiples of 8: 16xH100) compile with
XLA:GPU itself on compile-only CUDA devices when jax's CUDA plugin is installed beside the
venv (`make install-gpu-plan`: GPU_PLAN_DIR), from the target descriptions in
cardjax/plan/gpu_specs.py: no GPU and no CUDA driver needed. Without the plugin (or with
`estimate=True`) they compile on simulated CPU devices: XLA:CPU's memory plan of the same
program, an estimate (another compiler, no GPU fusions), labelled as one.
"""

from __future__ import annotations

import dataclasses
import os
import re
import sys

from cardjax.errors import CardjaxError
from cardjax.peaks import peak_flops_for_kind
from cardjax.plan.gpu_specs import GPU_SPECS

# Where `make install` puts libtpu: beside the venv, so that only plan processes see it.
LIBTPU_DIR = os.environ.get("CARDJAX_LIBTPU_DIR") or os.path.join(sys.prefix, "libtpu-plan")
# Where `make install-gpu-plan` puts jax's CUDA plugin and ptxas, likewise: on the path of a
# plan process only, since a plugin on every process's path would make jax look for a GPU.
GPU_PLAN_DIR = os.environ.get("CARDJAX_GPU_PLAN_DIR") or os.path.join(sys.prefix, "gpu-plan")
# The compilers a plan's memory comes from.
XLA_TPU, XLA_GPU, XLA_CPU_ESTIMATE = "xla-tpu", "xla-gpu", "xla-cpu-estimate"

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
# Per GPU: memory as nvidia-smi reports it (cardjax/plan/gpu_specs.py has the rest).
GPUS = {kind: spec.memory for kind, spec in GPU_SPECS.items()}


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
  compiler: str = XLA_TPU  # XLA_TPU, XLA_GPU or XLA_CPU_ESTIMATE (parse_target decides)

  @property
  def estimate(self) -> bool:
    """True where the memory plan is XLA:CPU's stand-in, not the target's own compiler."""
    return self.compiler == XLA_CPU_ESTIMATE

  @property
  def gpu_topology(self) -> str:
    """XLA's compile-only CUDA topology: partitions x hosts x GPUs per host (8 a node)."""
    per_host = min(self.chips, 8)
    return f"1x{self.chips // per_host}x{per_host}"


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


def parse_target(name: str, estimate: bool = False) -> Target:
  """Target from 'v5p-64', 'v5e-16', 'v6e-8', 'v4-32', '8xH200', ... (one clear error). A
  GPU node compiles with XLA:GPU where the CUDA plugin is ready, else (or with `estimate`)
  on simulated CPU devices."""
  text = name.strip()
  gpu = re.fullmatch(r"(\d+)\s*[xX]\s*([A-Za-z]\d+)", text)
  if gpu:
    count, kind = int(gpu.group(1)), gpu.group(2).upper()
    if kind not in GPUS or count < 1:
      raise CardjaxError(f"topology {name!r}: unknown GPU {kind!r}; use N x one of "
                         f"{sorted(GPUS)} (e.g. 8xH200)")
    if count > 8 and count % 8:
      raise CardjaxError(f"topology {name!r}: a GPU node holds 1 to 8 GPUs; several nodes are "
                         f"a multiple of 8 (16x{kind}, 32x{kind})")
    return Target(text, "gpu", kind, count, GPUS[kind], peak_flops_for_kind(kind),
                  compiler=XLA_CPU_ESTIMATE if estimate or not gpu_plugin_ready() else XLA_GPU)
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


def gpu_plugin_ready() -> bool:
  """True when this process compiles with XLA:GPU: jax's CUDA plugin is importable and jax,
  if it has started, loaded it (jax imports its plugins once, when it is imported)."""
  import importlib.util

  if "jax" in sys.modules:
    return "jax_cuda12_plugin" in sys.modules
  return importlib.util.find_spec("jax_cuda12_plugin") is not None


def gpu_plugin_in_plan_dir() -> bool:
  """True when `make install-gpu-plan` has put jax's CUDA plugin in GPU_PLAN_DIR."""
  return os.path.isdir(os.path.join(GPU_PLAN_DIR, "jax_cuda12_plugin"))


def add_gpu_plugin_path() -> bool:
  """Put GPU_PLAN_DIR on this process's path before jax starts (jax finds its plugins once,
  when it first initialises its backends), and the CUDA compiler it holds (ptxas) on PATH.
  JAX_PLATFORMS=cpu must be set too: the plugin then registers its compile-only topologies
  without asking for a CUDA driver. True when the plugin is there."""
  if not gpu_plugin_in_plan_dir():
    return gpu_plugin_ready()
  if GPU_PLAN_DIR not in sys.path:
    sys.path.append(GPU_PLAN_DIR)
  ptxas = os.path.join(GPU_PLAN_DIR, "nvidia", "cuda_nvcc", "bin")
  if os.path.isdir(ptxas) and ptxas not in os.environ.get("PATH", "").split(os.pathsep):
    os.environ["PATH"] = os.environ.get("PATH", "") + os.pathsep + ptxas
  return True


def gpu_devices(kind: str, topology: str) -> list:
  """XLA:GPU's compile-only devices of `kind` (a key of GPU_SPECS) laid out as `topology`."""
  from jax.experimental import topologies

  from cardjax.plan.gpu_specs import target_config

  try:
    # The CUDA topology is an option of the plugin, not jax's topology_name.
    return list(topologies.get_topology_desc(platform="cuda", topology=topology,
                                             target_config=target_config(kind)).devices)
  except Exception as e:  # no plugin registered, or one that cannot make this topology
    raise CardjaxError(
        f"cannot make compile-only {kind} devices ({topology}): "
        f"{str(e).splitlines()[0][:200]}; `make install-gpu-plan` puts jax's CUDA plugin in "
        f"{GPU_PLAN_DIR} and the process must start with it on its path and "
        "JAX_PLATFORMS=cpu (`cardjax plan` does both)") from None


def target_devices(target: Target) -> list:
  """The devices to compile for: libtpu's or XLA:GPU's compile-only devices, or the
  simulated CPU ones of a GPU estimate."""
  import jax

  if target.compiler == XLA_GPU:
    return gpu_devices(target.chip, target.gpu_topology)

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
