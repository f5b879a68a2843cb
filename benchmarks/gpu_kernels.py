"""Every Pallas GPU kernel compiled for H100 (sm_90) and A100 (sm_80) without a GPU.

  python -m benchmarks.gpu_kernels [--out FILE.json] [--targets H100,A100] [--workers 2]

XLA:GPU compiles on compile-only CUDA devices (jax's CUDA plugin in GPU_PLAN_DIR, `make
install-gpu-plan`; cardjax/plan/targets.py): the block-sparse forward, its dq and dk/dv
kernels (each compiled alone: value_and_grad of pallas_gpu_attention with respect to q, or
to k and v, so that XLA drops the other backward kernel) and the flash-decoding kernel
(pallas_decode). Per (kernel, target, mask kind, head dim, dtype, tiles) it records whether
the compiler took it or its refusal (first line), the compile seconds, the threads and
shared memory of the launch (XLA's thunk sequence) and the registers and spills ptxas
reports for the kernel's PTX, against the target's limits (the opt-in shared memory of
one block, 65536 registers per block), and what cardjax/attention/pallas_gpu_fit.py
predicts.

Tiles are swept (with every head dim, dtype and target) for one mask kind, dual_stream,
which reads the most metadata; every other mask kind compiles at the default tiles only
(bfloat16, head_dim 128), since the kind changes only the metadata a loop step loads.
float32 kernels use plain FMA dots (no TF32) whose PTX takes ptxas minutes at large tiles,
so float32 compiles tiles up to FP32_AREA, and larger ones only where the formula says the
compiler will refuse them (before ptxas runs: seconds); the rest are recorded as skipped.
Each compile dumps into a fresh temporary folder, removed after it is read.
"""

from __future__ import annotations

import concurrent.futures
import dataclasses
import glob
import json
import multiprocessing
import os
import re
import shutil
import subprocess
import tempfile
import time

from benchmarks.common import announce, arg_parser

KINDS = {"causal": 0, "bidirectional": 0, "dual_stream": 4, "bd3lm": 16, "block_causal": 16}
SWEEP_KIND = "dual_stream"
HEAD_DIMS = (64, 128)
DTYPES = ("bfloat16", "float32")
# (block_q, block_k) per training kernel; the decode kernel's block_q is its row tile
# (block_r: the folded query rows, 16 for an AR step of 4 heads a kv head, 64 for a prefill).
TILES = {
    "fwd": [(32, 32), (64, 64), (128, 64), (64, 128), (128, 128), (256, 64), (256, 128)],
    "dq": [(32, 32), (32, 64), (64, 32), (64, 64), (128, 64), (64, 128), (128, 128)],
    "dkv": [(32, 32), (32, 64), (64, 32), (64, 64), (128, 64), (64, 128), (128, 128)],
    "decode": [(16, 32), (16, 64), (16, 128), (64, 32), (64, 64), (64, 128), (64, 256)],
}
DEFAULT_TILES = {"fwd": (128, 64), "dq": (64, 64), "dkv": (64, 64), "decode": (16, 64)}
# The 32 x 64 and 64 x 32 backward tiles find where 16-bit dots switch between mma and
# wgmma; float32 dots are FMA ones whatever the tiles, so float32 skips them.
MIXED = ((32, 64), (64, 32))
# float32 FMA code takes ptxas minutes at large tiles (2 loaded CPU cores: 46 s for the
# forward at 128 x 128, d = 64; 3 min for dq at 128 x 64, d = 64), so float32 compiles the
# tiles up to these areas, and larger ones only where the formula says they do not fit
# (refused before ptxas runs, in seconds); the others are recorded as skipped.
FP32_AREA = {"fwd": 128 * 64, "dq": 64 * 64, "dkv": 64 * 64, "decode": 64 * 64}
KERNEL_NAMES = {"fwd": "cardjax_block_sparse_attention_fwd",
                "dq": "cardjax_block_sparse_attention_dq",
                "dkv": "cardjax_block_sparse_attention_dkv",
                "decode": "cardjax_flash_decoding"}
ARCH = {"H100": "sm_90a", "H200": "sm_90a", "A100": "sm_80"}
REGISTERS_PER_BLOCK = 65536
# Shapes: the tiles, not the lengths, decide what a kernel holds; these keep tables small.
BATCH, LENGTH, HEADS, KV_HEADS, SLOTS = 1, 1024, 8, 2, 4096
THUNK = re.compile(r"(cardjax_\w+) grid: \[([\d, ]+)\] threads: \[([\d, ]+)\]\s+"
                   r"shared_memory: (\d+) bytes")


@dataclasses.dataclass(frozen=True)
class Job:
  kernel: str  # fwd, dq, dkv, decode
  target: str  # a key of cardjax.plan.gpu_specs.GPU_SPECS
  kind: str
  head_dim: int
  dtype: str
  block_q: int
  block_k: int


def jobs(targets) -> list[Job]:
  """The tile sweep for SWEEP_KIND, then every other kind at the default tiles, with every
  head dim and dtype (the kind changes only the metadata each loop step loads)."""
  out = []
  for target in targets:
    for kernel, tiles in TILES.items():
      for d in HEAD_DIMS:
        for dtype in DTYPES:
          out += [Job(kernel, target, SWEEP_KIND, d, dtype, *tile) for tile in tiles
                  if dtype != "float32" or tile not in MIXED]
    out += [Job(kernel, target, kind, d, dtype, *tile) for kind in KINDS
            if kind != SWEEP_KIND for kernel, tile in DEFAULT_TILES.items()
            for d in HEAD_DIMS for dtype in DTYPES]
  return out


def warps(job: Job) -> int:
  from cardjax.attention import pallas_decode
  from cardjax.attention.pallas_common import num_warps

  if job.kernel == "decode":
    return pallas_decode.num_warps(job.block_q, job.head_dim)
  return num_warps(job.head_dim)


def predicted(job: Job) -> tuple[int, bool]:
  """(bytes, fits) by cardjax/attention/pallas_gpu_fit.py."""
  from cardjax.attention.pallas_gpu_fit import fits, gpu_of_kind, smem_bytes
  from cardjax.plan.gpu_specs import GPU_SPECS

  gpu = gpu_of_kind(GPU_SPECS[job.target].name)
  itemsize = 4 if job.dtype == "float32" else 2
  args = (job.kind, job.block_q, job.block_k, job.head_dim, itemsize, warps(job))
  return smem_bytes(job.kernel, gpu.sm, *args), fits(job.kernel, gpu, *args)


def too_slow(job: Job) -> bool:
  """A float32 job past FP32_AREA that the formula says fits: not compiled."""
  return (job.dtype == "float32" and job.block_q * job.block_k > FP32_AREA[job.kernel]
          and predicted(job)[1])


def _program(job: Job, sharding):
  """(function, argument shapes) whose compiled program holds job's kernel."""
  import jax
  import jax.numpy as jnp

  from cardjax.attention import MaskSpec
  from cardjax.attention.pallas_decode import pallas_decode_attention
  from cardjax.attention.pallas_gpu import pallas_gpu_attention

  spec = MaskSpec(job.kind, KINDS[job.kind])
  dtype = jnp.dtype(job.dtype)

  def shape(*dims, dt=dtype):
    return jax.ShapeDtypeStruct(dims, dt, sharding=sharding)

  d = job.head_dim
  if job.kernel == "decode":
    # block_r = the folded rows (queries x heads a kv head), so the query count sets it.
    tq = job.block_q * KV_HEADS // HEADS
    meta_q, meta_k = [shape(BATCH, tq, dt=jnp.int32)] * 3, [shape(BATCH, SLOTS, dt=jnp.int32)] * 3

    def decode(q, k, v, mq, mk):
      return pallas_decode_attention(q, k, v, spec, mq, mk, interpret=False,
                                     block_k=job.block_k, num_splits=1)
    return decode, (shape(BATCH, tq, HEADS, d), shape(BATCH, KV_HEADS, SLOTS, d),
                    shape(BATCH, KV_HEADS, SLOTS, d), meta_q, meta_k)

  meta = [shape(BATCH, LENGTH, dt=jnp.int32)] * 3
  args = (shape(BATCH, LENGTH, HEADS, d), shape(BATCH, LENGTH, KV_HEADS, d),
          shape(BATCH, LENGTH, KV_HEADS, d), meta)
  if job.kernel == "fwd":
    def forward(q, k, v, m):
      return pallas_gpu_attention(q, k, v, spec, m, m, interpret=False, block_q=job.block_q,
                                  block_k=job.block_k)
    return forward, args

  # A backward kernel alone: the other one's outputs are unused and XLA drops it; the
  # forward it needs runs at 32 x 32 tiles, which compile fast and fit everywhere.
  argnums = (0,) if job.kernel == "dq" else (1, 2)

  def loss_grads(q, k, v, m):
    def loss(q, k, v):
      out = pallas_gpu_attention(q, k, v, spec, m, m, interpret=False, block_q=32, block_k=32,
                                 bwd_block_q=job.block_q, bwd_block_k=job.block_k)
      return jnp.sum(out.astype(jnp.float32))
    return jax.value_and_grad(loss, argnums=argnums)(q, k, v)
  return loss_grads, args


def ptxas_path() -> str:
  """The ptxas XLA compiles with: the one in GPU_PLAN_DIR (its xla_gpu_cuda_data_dir),
  not whichever comes first on PATH."""
  from cardjax.plan.targets import GPU_PLAN_DIR

  path = os.path.join(GPU_PLAN_DIR, "nvidia", "cuda_nvcc", "bin", "ptxas")
  return path if os.path.isfile(path) else (shutil.which("ptxas") or "ptxas")


def _ptxas(dump: str, name: str) -> dict:
  """Registers and spills of kernel `name` by `ptxas -v` on its PTX (XLA runs the same
  ptxas with the same target when it compiles; it does not print them)."""
  entry = re.compile(rf"\.entry {name}\(")
  for path in glob.glob(os.path.join(dump, "*.ptx")):
    text = open(path).read()
    if entry.search(text):
      arch = re.search(r"^\.target (\w+)", text, re.M).group(1)
      start = time.perf_counter()
      run = subprocess.run([ptxas_path(), f"-arch={arch}", "-v", path, "-o", os.devnull],
                           capture_output=True, text=True)
      info = run.stdout + run.stderr
      regs = re.search(r"Used (\d+) registers", info)
      spills = re.search(r"(\d+) bytes spill stores, (\d+) bytes spill loads", info)
      if not regs:
        return {"ptxas_error": info.strip().splitlines()[-1] if info.strip() else "no output"}
      return {"arch": arch, "registers": int(regs.group(1)),
              "spill_stores": int(spills.group(1)) if spills else 0,
              "spill_loads": int(spills.group(2)) if spills else 0,
              "ptxas_s": round(time.perf_counter() - start, 2)}
  return {"ptxas_error": f"no PTX holds .entry {name}"}


def compile_job(job: Job) -> dict:
  """Compile job's program for its target in a fresh dump folder; the kernel's record."""
  import jax
  from jax.sharding import NamedSharding, PartitionSpec

  from cardjax.attention.pallas_common import NUM_STAGES
  from cardjax.plan.gpu_specs import GPU_SPECS
  from cardjax.plan.targets import gpu_devices

  name = KERNEL_NAMES[job.kernel]
  formula, fit = predicted(job)
  record = dict(dataclasses.asdict(job), smem_limit=GPU_SPECS[job.target].smem_per_block_optin,
                num_warps=warps(job), num_stages=NUM_STAGES, formula_bytes=formula,
                formula_fits=fit)
  if too_slow(job):
    record.update(status="skipped", error="float32 tiles past FP32_AREA that fit by the "
                  "formula: ptxas would take minutes")
    return record
  devices = gpu_devices(job.target, "1x1x1")
  sharding = NamedSharding(jax.sharding.Mesh(devices, ("x",)), PartitionSpec())
  fn, args = _program(job, sharding)
  dump = tempfile.mkdtemp(prefix="cardjax-gpu-kernels-")
  try:
    start = time.perf_counter()
    try:
      jax.jit(fn).lower(*args).compile(compiler_options={"xla_dump_to": dump})
      record["status"] = "compiled"
    except Exception as e:  # the compiler's refusal, kept as the result
      first = str(e).strip().splitlines()[0] if str(e).strip() else type(e).__name__
      record.update(status="refused", error=first[:300])
      requested = re.search(r"requested (\d+)", first)
      if requested:
        record["smem_bytes"] = int(requested.group(1))
    record["compile_s"] = round(time.perf_counter() - start, 2)
    if record["status"] == "compiled":
      launches = []
      for path in glob.glob(os.path.join(dump, "*thunk_sequence_after_thunk_passes.txt")):
        launches += [m for m in THUNK.finditer(open(path).read()) if m.group(1) == name]
      if not launches:
        record.update(status="missing", error=f"no {name} launch in the thunk sequence")
        return record
      threads = [int(x) for x in launches[0].group(3).split(",")]
      record.update(threads=threads[0] * threads[1] * threads[2],
                    smem_bytes=int(launches[0].group(4)))
      record.update(_ptxas(dump, name))
      if "registers" in record:
        record["registers_per_block"] = record["registers"] * record["threads"]
  finally:
    shutil.rmtree(dump, ignore_errors=True)
  return record


def _start_worker(trace_check: bool = False) -> None:
  """A worker process: the plugin on the path before jax starts (spawned, not forked).
  Without trace_check the kernels do not look up their target GPU, so tiles over its
  shared memory reach the compiler, whose refusal the sweep records (with the check,
  pallas_gpu_fit refuses them at trace time)."""
  from cardjax.plan.targets import add_gpu_plugin_path

  add_gpu_plugin_path()
  os.environ["JAX_PLATFORMS"] = "cpu"
  if not trace_check:
    from cardjax.attention import pallas_decode, pallas_gpu

    pallas_gpu.target_gpu = pallas_decode.target_gpu = lambda x: None


def _versions() -> dict:
  import importlib.metadata as metadata

  out = {}
  for package in ("jax", "jaxlib", "jax-cuda12-plugin", "jax-cuda12-pjrt",
                  "nvidia-cuda-nvcc-cu12"):
    try:
      out[package] = metadata.version(package)
    except metadata.PackageNotFoundError:
      out[package] = None
  run = subprocess.run([ptxas_path(), "--version"], capture_output=True, text=True)
  release = re.search(r"release ([\d.]+), (V[\d.]+)", run.stdout)
  out["ptxas"] = " ".join(release.groups()) if release else run.stdout.strip()[-80:]
  return out


def _cell(r: dict) -> str:
  if r["status"] == "skipped":
    return f"not compiled (formula {r['formula_bytes']} B)"
  if r["status"] != "compiled":
    need = f" ({r['smem_bytes']} B)" if "smem_bytes" in r else ""
    return f"refused{need}"
  regs = r.get("registers")
  spill = r.get("spill_stores", 0)
  text = f"{r['smem_bytes']} B, {regs} regs x {r['threads']}"
  return text + (f", spills {spill} B" if spill else "")


def table(records: list[dict]) -> str:
  """Markdown: one row per kernel, tiles, head dim and dtype; a column per target."""
  targets = sorted({r["target"] for r in records}, reverse=True)
  rows: dict = {}
  for r in records:
    key = (r["kernel"], r["kind"], r["head_dim"], r["dtype"], r["block_q"], r["block_k"])
    rows.setdefault(key, {})[r["target"]] = r
  order = list(KERNEL_NAMES)
  lines = ["| kernel | mask | d | dtype | tiles | " + " | ".join(targets) + " |",
           "|---" * (5 + len(targets)) + "|"]
  for key in sorted(rows, key=lambda k: (order.index(k[0]), k[1] != SWEEP_KIND, k[1], k[2],
                                         k[3], k[4], k[5])):
    kernel, kind, d, dtype, bq, bk = key
    cells = [_cell(rows[key][t]) if t in rows[key] else "" for t in targets]
    lines.append(f"| {kernel} | {kind} | {d} | {dtype} | {bq} x {bk} | " + " | ".join(cells)
                 + " |")
  return "\n".join(lines)


def main() -> None:
  parser = arg_parser(__spec__, __doc__)
  parser.add_argument("--out", default=None, help="write the records here (JSON)")
  parser.add_argument("--targets", default="H100,A100")
  parser.add_argument("--workers", type=int, default=2, help="compiles at once")
  parser.add_argument("--kernels", default=",".join(TILES), help="a subset of " + ",".join(TILES))
  parser.add_argument("--dtypes", default=",".join(DTYPES))
  args = parser.parse_args()

  _start_worker(trace_check=True)
  from cardjax.plan.targets import GPU_PLAN_DIR, gpu_plugin_ready

  if not gpu_plugin_ready():
    raise SystemExit(f"jax's CUDA plugin is not in {GPU_PLAN_DIR}: run `make install-gpu-plan`")
  info = announce("Pallas GPU kernels compiled without a GPU")
  versions = _versions()
  print("versions: " + ", ".join(f"{k} {v}" for k, v in versions.items()), flush=True)
  todo = [j for j in jobs(args.targets.split(","))
          if j.kernel in args.kernels.split(",") and j.dtype in args.dtypes.split(",")]
  # The slow float32 compiles first, so that two workers end together.
  todo.sort(key=lambda j: (j.dtype != "float32", -j.block_q * j.block_k * j.head_dim))
  start = time.perf_counter()
  records = []
  context = multiprocessing.get_context("spawn")  # jax must start in each worker, not fork
  with concurrent.futures.ProcessPoolExecutor(args.workers, mp_context=context,
                                              initializer=_start_worker) as pool:
    for record in pool.map(compile_job, todo):
      records.append(record)
      print(f"{record['target']} {record['kernel']} {record['kind']} d={record['head_dim']} "
            f"{record['dtype']} {record['block_q']}x{record['block_k']}: {_cell(record)} "
            f"({record.get('compile_s', 0)} s)", flush=True)
  wall = time.perf_counter() - start
  print(f"\n{len(records)} jobs in {wall:.0f} s wall\n")
  print(table(records))
  if args.out:
    os.makedirs(os.path.dirname(args.out) or ".", exist_ok=True)
    with open(args.out, "w") as f:
      json.dump({"machine": info, "versions": versions, "wall_s": round(wall, 1),
                 "workers": args.workers, "shapes": {"batch": BATCH, "length": LENGTH,
                                                     "heads": HEADS, "kv_heads": KV_HEADS,
                                                     "slots": SLOTS},
                 "registers_per_block_limit": REGISTERS_PER_BLOCK, "records": records},
                f, indent=1)
    print(f"\nwrote {args.out}")


if __name__ == "__main__":
  main()
