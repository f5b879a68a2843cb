"""The Pallas GPU kernels compiled by XLA:GPU for an H100, without a GPU.

jax's CUDA plugin (GPU_PLAN_DIR, `make install-gpu-plan`) must be on the path before jax
starts, and pytest's process has started jax without it, so the compiles run in a
subprocess (benchmarks/gpu_kernels.py's compile_job, the sweep's own code). bfloat16,
head_dim 64: each kernel compiles in a second or two.
"""

import json
import os
import subprocess
import sys

import pytest

from cardjax.plan.targets import GPU_PLAN_DIR, gpu_plugin_in_plan_dir

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
pytestmark = pytest.mark.skipif(
    not gpu_plugin_in_plan_dir(),
    reason=f"no jax_cuda12_plugin in {GPU_PLAN_DIR} (`make install-gpu-plan` puts it there)")

SCRIPT = """
import json, sys
from benchmarks.gpu_kernels import Job, _start_worker, compile_job
_start_worker(trace_check=True)
import jax.numpy as jnp
from cardjax.attention import MaskSpec
from cardjax.attention.pallas_gpu import lower_for_gpu, pallas_gpu_attention
from cardjax.errors import CardjaxError

out = {"records": [compile_job(Job(kernel, "H100", "dual_stream", 64, "bfloat16", bq, bk))
                   for kernel, bq, bk in (("fwd", 128, 64), ("dq", 64, 64), ("dkv", 64, 64),
                                          ("decode", 16, 64))]}
# Tiles over the limit, asked for explicitly: refused at trace time, before any compile.
q = jnp.zeros((1, 512, 4, 128), jnp.float32)
meta = (jnp.zeros((1, 512), jnp.int32),) * 3
try:
  lower_for_gpu(lambda q: pallas_gpu_attention(q, q, q, MaskSpec("causal"), meta, meta,
                                               interpret=False, block_q=256, block_k=128),
                q, device_kind="NVIDIA H100 80GB HBM3")
  out["error"] = None
except CardjaxError as e:
  out["error"] = str(e)
print("RESULT " + json.dumps(out))
"""


@pytest.fixture(scope="module")
def compiled():
  env = dict(os.environ, PYTHONPATH=ROOT)
  run = subprocess.run([sys.executable, "-c", SCRIPT], cwd=ROOT, env=env, capture_output=True,
                       text=True, timeout=300)
  lines = [x for x in run.stdout.splitlines() if x.startswith("RESULT ")]
  assert run.returncode == 0 and lines, run.stderr[-3000:]
  return json.loads(lines[-1][len("RESULT "):])


def test_every_kernel_compiles_for_h100_within_its_limits(compiled):
  from cardjax.attention.pallas_gpu_fit import SLACK, smem_bytes

  for r in compiled["records"]:
    assert r["status"] == "compiled", r
    assert 0 < r["smem_bytes"] <= r["smem_limit"] == 232448, r
    assert r["registers"] > 0 and r["registers_per_block"] <= 65536, r
    # the fit formula: exact, but for the 512 bytes sm_90's dk/dv asks at 64 x 64
    need = smem_bytes(r["kernel"], (9, 0), r["kind"], r["block_q"], r["block_k"], 64, 2,
                      r["num_warps"])
    assert 0 <= r["smem_bytes"] - need <= SLACK, r


def test_tiles_over_the_limit_are_refused_with_the_fix(compiled):
  error = compiled["error"]
  assert error is not None
  for needle in ("forward (fwd)", "block_q=256, block_k=128", "394", "232448",
                 "NVIDIA H100", "smaller tiles"):
    assert needle in error, (needle, error)
