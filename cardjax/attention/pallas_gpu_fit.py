"""Which tiles of the Pallas GPU kernels fit a GPU's shared memory, known before compiling.

  target_gpu(x)                      the GPU a kernel on array x compiles for, or None
  smem_bytes(kernel, gpu, ...)       shared memory the Triton-compiled kernel asks for
  check_fits(kernel, gpu, ...)       raise CardjaxError when it is over the GPU's limit
  fitting_tiles(kernel, gpu, ...)    the default tiles, halved until they fit

A block that asks for more shared memory than the GPU grants one block fails at compile
time with "RESOURCE_EXHAUSTED: Shared memory size limit exceeded", after tracing and
lowering, naming neither the kernel nor its tiles. The formula here lets pallas_gpu and
pallas_decode choose default tiles that fit and refuse explicit ones that cannot, at trace
time, with the fix.

The formula counts what the Triton compiler (jax 0.10's, through XLA:GPU) keeps in shared
memory for each kernel, in bytes, with s the input itemsize, R = head_dim * s one tile row,
W the warps and S = num_stages:

  tiles held for the whole program   fwd, decode: q (block_q rows); dq: q and do (2 x
                                     block_q rows); dkv: k and v (2 x block_k rows), except
                                     on the FMA path, which keeps them in registers
  tiles streamed by the loop         fwd, dq, decode: k and v; dkv: q and do; S buffers each
                                     on the wgmma path (Hopper's async tensor-core dot reads
                                     its operands from shared memory), S - 1 otherwise
  vectors streamed by the loop       4 bytes x tile length x (S - 1) per array: the metadata
                                     arrays the mask kind reads (1 to 3), plus lse and delta
                                     in dkv
  layout scratch                     the block_q x block_k probability tile (s bytes each)
                                     where it must change layout between two dots: always
                                     in dkv (p^T and ds^T feed the dk, dv dots) and on the
                                     FMA path; on the mma path when block_q < 16 W (the
                                     warps do not all fit along the rows); on the tensor-core
                                     paths, one byte per score for the two-stream masks
                                     (dual_stream, bd3lm) when block_q == 32 W; on the FMA
                                     path of the forward and decode kernels, the float32
                                     rescale factor (4 x block_q) when block_k != head_dim

The dot path is Triton's: float32 inputs (Precision.HIGHEST, no TF32) run FMA dots;
16-bit inputs run wgmma on sm_90 when every dot's M side is >= 64 rows (block_q; also
block_k for dkv), else mma (sm_80's tensor-core dot). benchmarks/gpu_kernels.py compiled
every kernel for H100 and A100 (results/kernels/pallas_gpu_compile_2026-12-04.json) and
tests/test_pallas_gpu_fit.py checks the formula against every number there, 306 kernels
compiled or refused: exact for all but 16. sm_90's dkv at block_q = 64, block_k <= 64 asks
512 bytes more (SLACK, which `fits` adds); the float32 rescale vector is not there at
head_dim 128 with block_k = 32 (the formula is 4 x block_q too high). Only num_stages = 2,
what every kernel uses, was compiled.
"""

from __future__ import annotations

import dataclasses
import re

import numpy as np

from cardjax.errors import CardjaxError

KERNELS = ("fwd", "dq", "dkv", "decode")
KERNEL_NAMES = {"fwd": "the block-sparse forward", "dq": "the dq backward",
                "dkv": "the dk/dv backward", "decode": "the flash-decoding kernel"}
# Metadata arrays MaskSpec.allowed reads on each side (the others are dead loads).
MASK_ARRAYS = {"causal": 2, "bidirectional": 1, "block_causal": 2, "dual_stream": 3, "bd3lm": 3}
TWO_STREAM = ("dual_stream", "bd3lm")
# Bytes the compiler may ask beyond the formula (see the module docstring).
SLACK = 512
# The most shared memory one block may opt into, by compute capability (CUDA C++
# Programming Guide, "Technical Specifications per Compute Capability": 163 KB on 8.0 and
# 8.7, 99 KB on 8.6 and 8.9, 227 KB on 9.0). The formula was checked on 8.0 and 9.0; the
# other 8.x parts are taken to compile 8.0's dot paths (mma), unchecked.
SMEM_OPTIN = {(8, 0): 166912, (8, 6): 101376, (8, 7): 166912, (8, 9): 101376,
              (9, 0): 232448}
# Device kinds of the GPUs the limits apply to, for devices that carry only their kind (an
# AbstractDevice): the kind CUDA reports, e.g. "NVIDIA H100 80GB HBM3".
KIND_SM = ((r"\bH(100|200|800)\b", (9, 0)), (r"\bA(100|800|30)\b", (8, 0)),
           (r"\b(L4|L40S?)\b", (8, 9)), (r"\bA(10|10G|40)\b", (8, 6)))


@dataclasses.dataclass(frozen=True)
class Gpu:
  """A GPU a kernel is compiled for: its device kind, compute capability, shared memory."""
  kind: str
  sm: tuple[int, int]
  smem_limit: int


def gpu_of_kind(kind: str, compute_capability=None) -> Gpu | None:
  """The Gpu of a device kind (and compute capability, when the device tells it, as
  "9.0"); None for a GPU whose limits this module does not know."""
  if compute_capability:
    major, _, minor = str(compute_capability).partition(".")
    sm = (int(major), int(minor or 0))
  else:
    sm = next((s for pattern, s in KIND_SM if re.search(pattern, kind or "")), None)
  if sm not in SMEM_OPTIN:
    return None
  return Gpu(kind, sm, SMEM_OPTIN[sm])


def _gpu_of_device(device) -> Gpu | None:
  if device is None or getattr(device, "platform", None) not in ("gpu", "cuda"):
    return None
  return gpu_of_kind(getattr(device, "device_kind", ""),
                     getattr(device, "compute_capability", None))


def target_gpu(x) -> Gpu | None:
  """The GPU a kernel called on x (an array or tracer) compiles for, or None: the device
  kind of x's sharding (under jit, its abstract mesh carries the kind of the devices the
  program compiles for, compile-only ones included), else that of the abstract mesh in
  context (pallas_gpu.lower_for_gpu), else the default device when it is a GPU."""
  import jax

  try:
    mesh = jax.typeof(x).sharding.mesh
  except Exception:  # no sharding on this value (older jax, a plain numpy array)
    mesh = None
  gpu = _gpu_of_device(getattr(mesh, "abstract_device", None))
  if gpu is None:
    gpu = _gpu_of_device(getattr(jax.sharding.get_abstract_mesh(), "abstract_device", None))
  if gpu is None and jax.default_backend() == "gpu":
    gpu = _gpu_of_device(jax.devices()[0])
  return gpu


def dot_path(kernel: str, sm: tuple[int, int], itemsize: int, block_q: int,
             block_k: int) -> str:
  """"fma", "wgmma" or "mma": how Triton compiles the kernel's dots (module docstring)."""
  if itemsize >= 4:
    return "fma"
  rows = min(block_q, block_k) if kernel == "dkv" else block_q
  return "wgmma" if sm == (9, 0) and rows >= 64 else "mma"


def smem_bytes(kernel: str, sm: tuple[int, int], kind: str, block_q: int, block_k: int,
               head_dim: int, itemsize: int, num_warps: int, num_stages: int = 2) -> int:
  """Shared memory (bytes) Triton asks for one block of `kernel` (module docstring).
  decode: block_q is the row tile (block_r)."""
  if kernel not in KERNELS:
    raise ValueError(f"unknown kernel {kernel!r}; expected one of {KERNELS}")
  path = dot_path(kernel, sm, itemsize, block_q, block_k)
  row = head_dim * itemsize
  streamed_buffers = num_stages if path == "wgmma" else num_stages - 1
  vector_bytes = 4 * (num_stages - 1)
  p_tile = block_q * block_k * itemsize
  arrays = MASK_ARRAYS[kind]
  if kernel == "dkv":
    held = 0 if path == "fma" else 2 * block_k * row
    streamed = 2 * streamed_buffers * block_q * row
    vectors = (2 + arrays) * vector_bytes * block_q
    return held + streamed + vectors + p_tile
  held = (2 if kernel == "dq" else 1) * block_q * row
  streamed = 2 * streamed_buffers * block_k * row
  vectors = arrays * vector_bytes * block_k
  scratch = p_tile if path == "fma" or (path == "mma" and block_q < 16 * num_warps) else 0
  if kernel != "dq" and path == "fma" and block_k != head_dim:
    scratch += 4 * block_q  # a float32 row vector between the scores' and the output's layouts
  if kind in TWO_STREAM and path != "fma" and block_q == 32 * num_warps:
    scratch += block_q * block_k  # the mask, one byte a score, in the dots' layout
  return held + streamed + vectors + scratch


def fits(kernel: str, gpu: Gpu, kind: str, block_q: int, block_k: int, head_dim: int,
         itemsize: int, num_warps: int, num_stages: int = 2) -> bool:
  """The formula's bytes, plus SLACK, within the GPU's opt-in shared memory."""
  need = smem_bytes(kernel, gpu.sm, kind, block_q, block_k, head_dim, itemsize, num_warps,
                    num_stages)
  return need + SLACK <= gpu.smem_limit


def check_fits(kernel: str, gpu: Gpu | None, kind: str, block_q: int, block_k: int,
               head_dim: int, dtype, num_warps: int, num_stages: int = 2,
               names: tuple[str, str] = ("block_q", "block_k")) -> None:
  """Raise CardjaxError when explicitly chosen tiles cannot fit `gpu` (None: unknown GPU,
  nothing checked); `names` are the arguments that set the two tile sizes."""
  itemsize = np.dtype(dtype).itemsize
  if gpu is None or fits(kernel, gpu, kind, block_q, block_k, head_dim, itemsize, num_warps,
                         num_stages):
    return
  need = smem_bytes(kernel, gpu.sm, kind, block_q, block_k, head_dim, itemsize, num_warps,
                    num_stages)
  raise CardjaxError(
      f"{KERNEL_NAMES[kernel]} ({kernel}) with {names[0]}={block_q}, {names[1]}={block_k} "
      f"(head_dim {head_dim}, {np.dtype(dtype).name}, {kind} mask) needs about {need} bytes "
      f"of shared memory per block; {gpu.kind} (sm_{gpu.sm[0]}{gpu.sm[1]}) grants "
      f"{gpu.smem_limit}. Pass smaller tiles (halve {names[1]} or {names[0]}), or None for "
      "tiles chosen to fit")


def fitting_tiles(kernel: str, gpu: Gpu | None, kind: str, block_q: int, block_k: int,
                  head_dim: int, dtype, num_warps, num_stages: int = 2,
                  min_block: int = 16) -> tuple[int, int]:
  """(block_q, block_k) halved, the larger first (block_k when equal: the loop streams
  it), until they fit `gpu`; unchanged when they fit or the GPU is unknown. num_warps:
  an int, or a function of the tiles (the decode kernel's warps depend on them)."""
  warps = num_warps if callable(num_warps) else (lambda bq, bk: num_warps)
  itemsize = np.dtype(dtype).itemsize
  while gpu is not None and not fits(kernel, gpu, kind, block_q, block_k, head_dim, itemsize,
                                     warps(block_q, block_k), num_stages):
    if block_k >= block_q and block_k > min_block:
      block_k //= 2
    elif block_q > min_block:
      block_q //= 2
    else:
      break  # the smallest tiles: let the compiler say what does not fit
  return block_q, block_k


def settle_tiles(kernels, block_q: int, block_k: int, *, gpu: Gpu | None, kind: str,
                 explicit: bool, head_dim: int, dtype, num_warps, names: tuple[str, str],
                 num_stages: int = 2) -> tuple[int, int]:
  """The tiles that `kernels` (which share them) run with on `gpu`: explicit tiles are
  checked (CardjaxError when one kernel cannot fit them), default ones halved until every
  kernel fits them."""
  warps = num_warps if callable(num_warps) else (lambda bq, bk: num_warps)
  if explicit:
    for kernel in kernels:
      check_fits(kernel, gpu, kind, block_q, block_k, head_dim, dtype,
                 warps(block_q, block_k), num_stages, names)
    return block_q, block_k
  while True:  # one kernel's halving may leave another over: again until none halves
    before = (block_q, block_k)
    for kernel in kernels:
      block_q, block_k = fitting_tiles(kernel, gpu, kind, block_q, block_k, head_dim, dtype,
                                       warps, num_stages)
    if (block_q, block_k) == before:
      return block_q, block_k
