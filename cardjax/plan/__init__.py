"""`cardjax plan`: will a recipe fit a machine, and how long will it run?

Compiles the real train step (cardjax/plan/compile.py) for a TPU slice or a GPU node
(cardjax/plan/targets.py) without allocating a weight, and reports per device the parameter
and optimizer-state shards, the compiler's temporaries (activations, gradients), the total
against the device's memory, the model FLOPs of a step, the step time at a stated MFU and
the days to the recipe's token budget (train.steps x batch x seq). When the step does not
fit, it compiles again with more gradient-accumulation micro-batches and says which
`train.grad_accum` fits, or that none does and how much the state alone needs.
"""

from __future__ import annotations

import copy
import dataclasses
import math
import re

from cardjax.errors import CardjaxError
from cardjax.plan.targets import (GIB, XLA_GPU, Target, add_gpu_plugin_path, add_libtpu_path,
                                  parse_target, target_devices)

OOM = re.compile(r"RESOURCE_EXHAUSTED|[Oo]ut of memory|exceeds? .*memory|hbm capacity")


@dataclasses.dataclass
class Plan:
  target: Target
  grad_accum: int
  fits: bool
  params: int = 0  # bytes per device
  opt_state: int = 0
  temp: int = 0
  total: int = 0
  flops_per_step: float = 0.0
  mesh: dict = dataclasses.field(default_factory=dict)
  compiler_error: str = ""  # the compiler's out-of-memory message, when it refused

  @property
  def compiler(self) -> str:
    """Whose memory plan this is: xla-tpu, xla-gpu or xla-cpu-estimate."""
    return self.target.compiler

  @property
  def hbm(self) -> int:
    return self.target.hbm_per_chip * self.target.chips // max(1, self.devices)

  @property
  def devices(self) -> int:
    return math.prod(self.mesh.values()) if self.mesh else self.target.chips


def _compile(config, target: Target, devices, accum: int) -> Plan:
  from cardjax.plan.compile import compile_step

  config = copy.deepcopy(config)
  config.train.grad_accum = accum
  try:
    got = compile_step(config, devices)
  except Exception as e:  # the TPU compiler refuses a program that exceeds HBM
    text = str(e)
    if "cuDNN not found" in text:  # jax asks the library its version before lowering
      raise CardjaxError(
          "cuDNN attention (model.attention_impl=cudnn, or auto on causal and bidirectional "
          "masks) cannot be compiled for GPUs here: the cuDNN library is missing; "
          "`make install-gpu-plan` installs it beside the venv, or plan with "
          "--config.model.attention_impl=pallas_gpu (or xla)") from None
    if not OOM.search(text):
      raise
    return Plan(target, accum, False, compiler_error=text.splitlines()[0][:300],
                mesh=planned_mesh(config, devices))
  plan = Plan(target, accum, True, got.params, got.opt_state, got.temp, got.total,
              got.flops_per_step, got.mesh)
  plan.fits = plan.total <= plan.hbm
  return plan


def planned_mesh(config, devices) -> dict:
  """The mesh shape the config takes on these devices (without compiling anything)."""
  from cardjax.parallel.mesh import mesh_shape
  from cardjax.parallel.sharding import MESH_AXES

  shape = mesh_shape(config.mesh.data, config.mesh.fsdp, config.mesh.tensor, len(devices))
  return dict(zip(MESH_AXES, shape))


def accum_choices(config, data_parallel: int) -> list[int]:
  """grad_accum values above the config's whose micro-batch still splits over the devices."""
  rows, start = config.data.batch_size, config.train.grad_accum
  return [a for a in (2, 4, 8, 16, 32, 64) if a > start and rows % a == 0
          and (rows // a) % data_parallel == 0]


def run_plan(config, topology: str, search: bool = True, estimate: bool = False) -> list[Plan]:
  """Plans of the config as given and, if it does not fit, with more micro-batches until
  one fits (each a compile). The last plan is the answer. `estimate`: a GPU node on
  simulated CPU devices even where XLA:GPU is ready."""
  target = parse_target(topology, estimate)
  devices = target_devices(target)
  if target.slices != config.mesh.slices:  # the mesh follows the machine: data across slices
    config = copy.deepcopy(config)
    config.mesh.slices = target.slices
    if config.mesh.data % target.slices:
      config.mesh.data = target.slices
  plans = [_compile(config, target, devices, config.train.grad_accum)]
  if plans[-1].fits or not search:
    return plans
  mesh = planned_mesh(config, devices)
  data_parallel = mesh["data"] * mesh["fsdp"]
  for accum in accum_choices(config, data_parallel):
    plans.append(_compile(config, target, devices, accum))
    if plans[-1].fits:
      break
  return plans


def _gib(n: int) -> str:
  return f"{n / GIB:.2f} GiB" if n >= GIB // 10 else f"{n / (1 << 20):.1f} MiB"


def report(config, plans: list[Plan], mfu: float) -> str:
  """The table the command prints."""
  first, last = plans[0], plans[-1]
  t = first.target
  rows, seq = config.data.batch_size, config.data.seq_len
  slices = f" in {t.slices} slices over DCN" if t.slices > 1 else ""
  where = (f", libtpu topology {t.libtpu_topology}" if t.libtpu_topology
           else f", XLA:GPU topology {t.gpu_topology}" if t.compiler == XLA_GPU else "")
  lines = [f"plan: {config.name} on {t.name} ({t.chips} {t.chip} chips{slices}{where}); "
           f"memory from {t.compiler}",
           f"  batch {rows} x seq {seq}, objective {config.objective.name}, "
           f"mesh {first.mesh}, remat {config.model.remat}, loss_chunk {config.train.loss_chunk}"]
  if t.estimate:
    lines.append("  memory: XLA:CPU's plan of the same program on simulated devices (an "
                 "estimate: the GPU compiler fuses and schedules differently; expect the same "
                 "weights and optimizer state, and different temporaries); "
                 "`make install-gpu-plan` lets the plan compile with XLA:GPU itself")
  elif t.compiler == XLA_GPU:
    lines.append("  memory: XLA:GPU's buffer assignment for compile-only devices "
                 "(cardjax/plan/gpu_specs.py), no GPU used; cuDNN and NCCL workspaces made at "
                 "run time are not in it")
  for p in plans:
    if p.compiler_error:
      lines.append(f"  grad_accum {p.grad_accum}: the compiler refused it: {p.compiler_error}")
      continue
    verdict = "fits" if p.fits else "DOES NOT FIT"
    lines.append(
        f"  grad_accum {p.grad_accum}: per device params {_gib(p.params)}, optimizer state "
        f"{_gib(p.opt_state)}, temporaries {_gib(p.temp)}, total {_gib(p.total)} of "
        f"{_gib(p.hbm)}: {verdict}")
  flop_plan = next((p for p in reversed(plans) if p.flops_per_step), None)
  if flop_plan:
    peak = t.peak_per_chip * t.chips
    step_s = flop_plan.flops_per_step / (peak * mfu)
    tokens = rows * seq
    days = config.train.steps * step_s / 86400
    lines.append(f"  model FLOPs per step {flop_plan.flops_per_step:.3e}; at {mfu:.0%} MFU of "
                 f"{peak:.3e} FLOP/s: {step_s:.3f} s per step, {tokens / step_s:,.0f} tokens/s")
    took = f"{days:.1f} days" if days >= 1 else f"{24 * days:.1f} hours"
    lines.append(f"  budget: {config.train.steps:,} steps x {tokens:,} tokens = "
                 f"{config.train.steps * tokens:.3e} tokens: {took}")
  if last.fits:
    if last is not first:
      lines.append(f"  => set --config.train.grad_accum={last.grad_accum} (or more chips)")
  else:
    state = last.params + last.opt_state or first.params + first.opt_state
    need = ""
    if state:
      need = (f"; parameters and optimizer state alone take {_gib(state)} per device of "
              f"{_gib(last.hbm)}")
    lines.append(f"  => does not fit with any grad_accum tried{need}: use more chips, "
                 "model.remat=full or train.loss_chunk")
  return "\n".join(lines)


def plan_env(topology: str, estimate: bool = False) -> None:
  """Set before jax starts: CPU as the default backend (compile-only devices run nothing),
  libtpu for a TPU slice, jax's CUDA plugin for a GPU node (XLA:GPU's compile-only
  devices) and, for a GPU estimate, that many simulated CPU devices."""
  import os
  import sys

  target = parse_target(topology, estimate)
  os.environ.setdefault("JAX_PLATFORMS", "cpu")
  if target.platform == "tpu":
    add_libtpu_path()
  if target.platform == "gpu" and not estimate and "jax" not in sys.modules:
    add_gpu_plugin_path()
    target = parse_target(topology, estimate)
  if target.estimate:
    flag = f"--xla_force_host_platform_device_count={target.chips}"
    flags = re.sub(r"--xla_force_host_platform_device_count=\d+", "",
                   os.environ.get("XLA_FLAGS", ""))
    if "jax" in sys.modules and flag not in os.environ.get("XLA_FLAGS", ""):
      import jax
      if len(jax.devices("cpu")) < target.chips:
        raise CardjaxError(f"jax started with {len(jax.devices('cpu'))} CPU devices before "
                           f"the plan could ask for {target.chips}; run `cardjax plan` in a "
                           "fresh process")
      return
    os.environ["XLA_FLAGS"] = (flags + " " + flag).strip()
