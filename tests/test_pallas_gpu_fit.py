"""cardjax/attention/pallas_gpu_fit.py: the shared-memory formula against every kernel
benchmarks/gpu_kernels.py compiled for H100 and A100 (the recorded JSON, no compile here),
the GPU a call compiles for, and how the kernels pick and refuse tiles."""

import json
from pathlib import Path

import numpy as np
import pytest

import jax
import jax.numpy as jnp

from cardjax.attention import MaskSpec
from cardjax.attention import pallas_decode as pd
from cardjax.attention import pallas_gpu as pg
from cardjax.attention import pallas_gpu_fit as fit
from cardjax.errors import CardjaxError

RESULTS = Path(__file__).resolve().parents[1] / "results/kernels/pallas_gpu_compile_2026-12-04.json"
SM = {"H100": (9, 0), "A100": (8, 0)}


def records():
  return json.loads(RESULTS.read_text())["records"]


def formula(r):
  itemsize = 4 if r["dtype"] == "float32" else 2
  return fit.smem_bytes(r["kernel"], SM[r["target"]], r["kind"], r["block_q"], r["block_k"],
                        r["head_dim"], itemsize, r["num_warps"], r["num_stages"])


def test_the_sweep_covers_every_kernel_target_kind_and_dtype():
  rs = records()
  assert {r["kernel"] for r in rs} == set(fit.KERNELS)
  assert {r["target"] for r in rs} == {"H100", "A100"}
  assert {r["kind"] for r in rs} == set(fit.MASK_ARRAYS)
  assert {r["dtype"] for r in rs} == {"bfloat16", "float32"}
  assert sum(r["status"] == "compiled" for r in rs) > 100
  assert any(r["status"] == "refused" for r in rs)


def test_formula_against_every_compiled_or_refused_kernel():
  """Exact, except the two residuals the module documents: sm_90 dk/dv at block_q 64 and
  block_k <= 64 asks 512 bytes more (within SLACK); the float32 rescale vector (4 x
  block_q) that the formula counts wherever block_k != head_dim is not always there."""
  checked = exact = 0
  for r in records():
    if "smem_bytes" not in r:
      continue
    over = r["smem_bytes"] - formula(r)
    if over > 0:
      assert over <= fit.SLACK, r
      assert (r["target"], r["kernel"], r["block_q"], r["dtype"]) == ("H100", "dkv", 64,
                                                                     "bfloat16"), r
      assert r["block_k"] <= 64, r
    elif over < 0:
      assert over == -4 * r["block_q"] and r["dtype"] == "float32", r
      assert r["kernel"] in ("fwd", "decode") and r["block_k"] != r["head_dim"], r
    exact += over == 0
    checked += 1
  assert checked > 150 and exact > 0.9 * checked


def test_formula_says_which_tiles_the_compiler_takes():
  for r in records():
    if r["status"] not in ("compiled", "refused"):
      continue
    gpu = fit.gpu_of_kind(r["target"])
    itemsize = 4 if r["dtype"] == "float32" else 2
    fits = fit.fits(r["kernel"], gpu, r["kind"], r["block_q"], r["block_k"], r["head_dim"],
                    itemsize, r["num_warps"], r["num_stages"])
    assert fits == (r["status"] == "compiled"), r
    if r["status"] == "refused":
      assert "Shared memory size limit exceeded" in r["error"], r


def test_compiled_kernels_stay_within_the_register_file():
  for r in records():
    if r["status"] == "compiled":
      assert r["smem_bytes"] <= r["smem_limit"]
      assert 0 < r["registers"] <= 255 and r["registers_per_block"] <= 65536, r


@pytest.mark.parametrize("kind,sm,limit", [
    ("NVIDIA H100 80GB HBM3", (9, 0), 232448), ("NVIDIA H200", (9, 0), 232448),
    ("NVIDIA A100-SXM4-80GB", (8, 0), 166912), ("NVIDIA H100", (9, 0), 232448),
    ("NVIDIA L4", (8, 9), 101376)])
def test_gpu_of_kind(kind, sm, limit):
  assert fit.gpu_of_kind(kind) == fit.Gpu(kind, sm, limit)


def test_unknown_gpus_and_compute_capabilities():
  assert fit.gpu_of_kind("NVIDIA B200") is None
  assert fit.gpu_of_kind("cpu") is None
  assert fit.gpu_of_kind("anything", "8.6").smem_limit == 101376
  assert fit.gpu_of_kind("anything", "10.0") is None


def test_limits_agree_with_the_plan_target_specs():
  from cardjax.plan.gpu_specs import GPU_SPECS

  for spec in GPU_SPECS.values():
    gpu = fit.gpu_of_kind(spec.name)
    assert (gpu.sm, gpu.smem_limit) == (spec.sm, spec.smem_per_block_optin), spec.name


def test_target_gpu_reads_the_abstract_mesh_and_is_none_on_cpu():
  assert fit.target_gpu(jnp.zeros(3)) is None
  device = jax.sharding.AbstractDevice(device_kind="NVIDIA A100-SXM4-80GB", num_cores=None,
                                       platform="gpu")
  mesh = jax.sharding.AbstractMesh((1,), ("gpu",), abstract_device=device)
  with jax.sharding.use_abstract_mesh(mesh):
    assert fit.target_gpu(jnp.zeros(3)).sm == (8, 0)


@pytest.mark.parametrize("d", [16, 32, 64, 128])
@pytest.mark.parametrize("dtype", [jnp.float32, jnp.bfloat16, jnp.float16])
@pytest.mark.parametrize("target", ["NVIDIA H100", "NVIDIA A100"])
def test_the_default_tiles_fit_h100_and_a100(d, dtype, target):
  gpu = fit.gpu_of_kind(target)
  warps = 4 if d <= 64 else 8
  for kind in fit.MASK_ARRAYS:
    for kernels, tiles in ((("fwd",), (pg.BLOCK_Q, pg.BLOCK_K)),
                           (("dq", "dkv"), (pg.BWD_BLOCK_Q, pg.BWD_BLOCK_K)),
                           (("decode",), (pd.BLOCK_R, pd.BLOCK_K))):
      n = (lambda r, _: pd.num_warps(r, d)) if kernels == ("decode",) else warps
      got = fit.settle_tiles(kernels, *tiles, gpu=gpu, kind=kind, explicit=False, head_dim=d,
                             dtype=dtype, num_warps=n, names=("q", "k"))
      assert got == tiles, (kernels, kind)


def test_default_tiles_are_halved_on_a_gpu_with_less_shared_memory():
  l4 = fit.gpu_of_kind("NVIDIA L4")  # sm_89: 99 KB a block
  got = fit.settle_tiles(("fwd",), 128, 64, gpu=l4, kind="dual_stream", explicit=False,
                         head_dim=128, dtype=np.float32, num_warps=8, names=("q", "k"))
  assert got != (128, 64) and fit.fits("fwd", l4, "dual_stream", *got, 128, 4, 8)
  # dq and dk/dv share their tiles: both must fit what comes out
  got = fit.settle_tiles(("dq", "dkv"), 64, 64, gpu=l4, kind="causal", explicit=False,
                         head_dim=128, dtype=np.float32, num_warps=8, names=("q", "k"))
  assert all(fit.fits(k, l4, "causal", *got, 128, 4, 8) for k in ("dq", "dkv"))
  assert got != (64, 64)


def _lower(block_q=None, block_k=None, dtype=jnp.float32, interpret=False,
           device_kind="NVIDIA A100-SXM4-80GB"):
  q = jnp.zeros((1, 256, 2, 128), dtype)
  meta = (jnp.zeros((1, 256), jnp.int32),) * 3

  def fn(q):
    return pg.pallas_gpu_attention(q, q, q, MaskSpec("dual_stream", 4), meta, meta,
                                   interpret=interpret, block_q=block_q, block_k=block_k)
  if interpret:
    return jax.eval_shape(fn, q)
  return pg.lower_for_gpu(fn, q, device_kind=device_kind)


def test_explicit_tiles_that_cannot_fit_raise_at_trace_time():
  with pytest.raises(CardjaxError) as e:
    _lower(block_q=128, block_k=128)
  text = str(e.value)
  for needle in ("forward (fwd)", "block_q=128, block_k=128", "263680", "166912",
                 "NVIDIA A100", "smaller tiles"):
    assert needle in text, (needle, text)
  # interpret mode (CPU) keeps no limit: the same tiles trace
  assert _lower(block_q=128, block_k=128, interpret=True).shape == (1, 256, 2, 128)


def test_default_tiles_shrink_for_the_target_instead_of_failing(monkeypatch):
  seen = []
  classes = pg.tile_classes
  monkeypatch.setattr(pg, "tile_classes",
                      lambda spec, qm, km, bq, bk: seen.append((bq, bk)) or classes(spec, qm, km,
                                                                                    bq, bk))
  _lower(device_kind="NVIDIA L4")  # 99 KB: float32 128 x 64 at head_dim 128 does not fit
  fwd, bwd = seen
  l4 = fit.gpu_of_kind("NVIDIA L4")
  assert fwd != (pg.BLOCK_Q, pg.BLOCK_K) and fit.fits("fwd", l4, "dual_stream", *fwd, 128, 4, 8)
  seen.clear()
  _lower(device_kind="NVIDIA H100")  # the defaults fit an H100
  assert seen == [(pg.BLOCK_Q, pg.BLOCK_K), (pg.BWD_BLOCK_Q, pg.BWD_BLOCK_K)]
