"""`cardjax plan` on XLA:GPU without a GPU: the tiny train step compiled for compile-only
H100s by the GPU compiler itself (jax's CUDA plugin from `make install-gpu-plan`), its
memory from XLA:GPU's buffer assignment, and the plan saying which compiler made it.

Each plan runs in a fresh process: jax loads its plugins once, when it is imported, and
this process started jax without the CUDA plugin (the plan command puts it on its path)."""

import json
import os
import subprocess
import sys

import pytest

from cardjax.plan.targets import GPU_PLAN_DIR, gpu_plugin_in_plan_dir, parse_target

TINY = ["--config.model.num_layers=2", "--config.model.hidden_size=64",
        "--config.data.batch_size=16", "--config.data.seq_len=64"]

needs_plugin = pytest.mark.skipif(
    not gpu_plugin_in_plan_dir(),
    reason=f"jax's CUDA plugin is not in {GPU_PLAN_DIR}: `make install-gpu-plan` (make test "
           "installs it)")


def plan(tmp_path, name, *args, config="configs/tiny_mars.py") -> dict:
  out = tmp_path / f"{name}.json"
  env = {k: v for k, v in os.environ.items() if k != "XLA_FLAGS"}  # the plan sets its own
  done = subprocess.run(
      [sys.executable, "-m", "cardjax.cli", "plan", "--config", config, *TINY,
       *args, "--json", str(out)], capture_output=True, text=True, env=env, timeout=600)
  assert done.returncode == 0, done.stdout + done.stderr
  got = json.loads(out.read_text())
  got["stdout"] = done.stdout + done.stderr
  return got


@pytest.mark.integration  # 25 s on 2 cores: XLA:GPU plans in a subprocess
@needs_plugin
def test_gpu_node_plans_come_from_xla_gpu_with_the_triton_kernels_inside(tmp_path):
  """8xH100 with the Pallas GPU kernel: the step compiles for sm_90 (the MARS dual-stream
  attention forward and backward as Triton kernels), the JSON and the table say xla-gpu,
  and the weights and optimizer shards are those of the XLA:CPU estimate (the same
  shardings); the temporaries are the GPU compiler's own."""
  gpu = plan(tmp_path, "gpu", "--topology", "8xH100",
             "--config.model.attention_impl=pallas_gpu")
  est = plan(tmp_path, "est", "--topology", "8xH100", "--estimate")
  assert gpu["compiler"] == "xla-gpu" and est["compiler"] == "xla-cpu-estimate"
  g, e = gpu["plans"][0], est["plans"][0]
  assert g["compiler"] == "xla-gpu" and g["target"]["compiler"] == "xla-gpu"
  assert "memory from xla-gpu" in gpu["stdout"] and "XLA:GPU topology 1x1x8" in gpu["stdout"]
  assert "memory from xla-cpu-estimate" in est["stdout"]
  assert g["fits"] and g["mesh"] == {"data": 1, "fsdp": 8, "tensor": 1}
  assert (g["params"], g["opt_state"]) == (e["params"], e["opt_state"]) and g["params"] > 0
  assert 0 < g["temp"] < g["total"] < 80 << 30
  assert g["total"] >= g["params"] + g["opt_state"]


@pytest.mark.integration  # 20 s on 2 cores: XLA:GPU plans in a subprocess
@needs_plugin
def test_two_gpu_nodes_and_one_gpu(tmp_path):
  """16xH100 is two nodes of 8 (XLA's topology 1x2x8, 16 devices in the mesh); 1xH200 one
  device with the H200's memory."""
  two = plan(tmp_path, "two", "--topology", "16xH100")
  assert two["compiler"] == "xla-gpu" and "XLA:GPU topology 1x2x8" in two["stdout"]
  assert two["plans"][0]["mesh"]["fsdp"] == 16
  one = plan(tmp_path, "one", "--topology", "1xH200")
  assert one["compiler"] == "xla-gpu" and one["plans"][0]["mesh"]["fsdp"] == 1
  assert one["plans"][0]["target"]["hbm_per_chip"] == 143771 << 20


@needs_plugin
def test_auto_attention_on_gpus_compiles_cudnn_for_causal_masks(tmp_path):
  """An AR step in bf16 with attention_impl=auto on 8 H100s with 2 accumulation
  micro-batches: on GPUs `auto` picks cuDNN's fused attention for the causal mask, and
  XLA:GPU compiles it without a GPU (the cuDNN library from `make install-gpu-plan`
  answers jax's version check). With contiguous micro-batches this failed in jax's
  custom_partitioner (an AssertionError in explode_superdims): each micro-batch lay on
  half the devices; the step now strides them (cardjax/train/step.py)."""
  got = plan(tmp_path, "cudnn", "--topology", "8xH100", "--config.model.attention_impl=auto",
             "--config.model.dtype=bfloat16", "--config.train.grad_accum=2",
             config="configs/tiny_ar.py")
  assert got["compiler"] == "xla-gpu" and got["plans"][0]["fits"]
  assert got["plans"][0]["grad_accum"] == 2
  assert "cudnn runs causal masks on gpu (attention_impl=auto)" in got["stdout"]


def test_gpu_topologies():
  assert parse_target("8xH200", estimate=True).gpu_topology == "1x1x8"
  assert parse_target("1xA100", estimate=True).gpu_topology == "1x1x1"
  assert parse_target("32xH100", estimate=True).gpu_topology == "1x4x8"
  assert parse_target("8xH200", estimate=True).compiler == "xla-cpu-estimate"
  from cardjax.errors import CardjaxError
  with pytest.raises(CardjaxError, match="multiple of 8"):
    parse_target("12xH100")
