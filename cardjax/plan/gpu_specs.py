"""The GPUs `cardjax plan` compiles for without one: each GPU's facts, and the
GpuTargetConfigProto text XLA:GPU's deviceless compiler reads them from.

The numbers are XLA's own target descriptions (openxla/xla,
xla/backends/gpu/target_config/specs/{h100_sxm,h200,a100_sxm_80}.txtpb, read 2026-12-04),
except `memory`, which is what nvidia-smi reports on such a card (the H200's 143771 MiB was
read on the H200 this project was lent on 2026-12-04). Only the fields that jax 0.10's CUDA
plugin parses and the compiler reads are written: the device limits that decide tiling,
occupancy and whether a kernel fits (shared memory, registers, threads), the compute
capability, and the cuDNN version that enables its fusions.
"""

from __future__ import annotations

import dataclasses


@dataclasses.dataclass(frozen=True)
class GpuSpec:
  name: str  # as the CUDA driver names the device (jax's device_kind)
  sm: tuple[int, int]  # compute capability
  cores: int  # streaming multiprocessors
  fpus_per_core: int
  memory: int  # bytes, as nvidia-smi reports it
  memory_bandwidth: int  # bytes/s
  l2_cache: int  # bytes
  clock_ghz: float
  smem_per_block_optin: int  # the most shared memory one block may ask for
  smem_per_core: int
  cudnn: tuple[int, int, int]


MIB = 1 << 20
GPU_SPECS = {
    "H100": GpuSpec("NVIDIA H100 80GB HBM3", (9, 0), 132, 128, 81559 * MIB, 3352320000000,
                    52428800, 1.98, 232448, 233472, (9, 10, 0)),
    "H200": GpuSpec("NVIDIA H200", (9, 0), 132, 128, 143771 * MIB, 4800000000000, 52428800,
                    1.98, 232448, 233472, (9, 10, 0)),
    "A100": GpuSpec("NVIDIA A100-SXM4-80GB", (8, 0), 108, 64, 81920 * MIB, 2039040000000,
                    41943040, 1.41, 166912, 167936, (8, 9, 4)),
}


def target_config(kind: str) -> str:
  """GpuTargetConfigProto text for `kind` (a key of GPU_SPECS)."""
  s = GPU_SPECS[kind]
  major, minor, patch = s.cudnn
  return f"""gpu_device_info {{
  threads_per_block_limit: 1024
  threads_per_warp: 32
  shared_memory_per_block: 49152
  shared_memory_per_core: {s.smem_per_core}
  threads_per_core_limit: 2048
  core_count: {s.cores}
  fpus_per_core: {s.fpus_per_core}
  block_dim_limit_x: 2147483647
  block_dim_limit_y: 65535
  block_dim_limit_z: 65535
  memory_bandwidth: {s.memory_bandwidth}
  l2_cache_size: {s.l2_cache}
  clock_rate_ghz: {s.clock_ghz}
  device_memory_size: {s.memory}
  shared_memory_per_block_optin: {s.smem_per_block_optin}
  cuda_compute_capability {{ major: {s.sm[0]} minor: {s.sm[1]} }}
  registers_per_core_limit: 65536
  registers_per_block_limit: 65536
}}
platform_name: "CUDA"
dnn_version_info {{ major: {major} minor: {minor} patch: {patch} }}
device_description_str: "{s.name}"
"""
