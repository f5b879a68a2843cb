"""The Hopper (Mosaic GPU) attention kernels without a GPU: numerics of the forward and the
backward in Mosaic GPU's CPU interpreter against the dense reference for every mask kind,
and both lowered and compiled by XLA:GPU for an H100 (the compiled variant, probabilities
from registers).

What this cannot check: the PTX Mosaic GPU makes when the program loads on a GPU, the
register-operand products (the interpreter takes wgmma operands from shared memory), and
speed. The prepared GPU call checks those (benchmarks/gpu_kernels.py).

Tolerance: bfloat16 inputs against the float32 reference on the same (rounded) values;
the kernels round the probabilities to bfloat16 before the second product, as every
flash kernel does, and return bfloat16: 2e-2 for the forward; gradients within 5% of the
largest reference entry (ds is rounded to bfloat16 too). The interpreter simulates every
warpgroup in Python, so the shapes are small (each case a few seconds to half a minute).
The interpreter needs PJRT_NPROC >= 4 on small machines (`make test-kernels` sets 8).
"""

import faulthandler
import json
import os
import subprocess
import sys

import numpy as np
import pytest

import jax
import jax.numpy as jnp

from cardjax.attention import MaskSpec, dense_mask, reference_attention
from cardjax.attention.pallas_gpu import tile_classes, visit_fractions
from cardjax.attention.pallas_mgpu import BLOCK_K, BLOCK_Q, mgpu_forward, unsupported_reason
from cardjax.attention.pallas_mgpu_bwd import mgpu_backward
from cardjax.plan.targets import GPU_PLAN_DIR, gpu_plugin_in_plan_dir
from compact_helpers import compact_corrupt, sft_batch
from test_pallas_gpu import inputs, packed_meta, seen

TOL = 2e-2
GRAD_TOL = 5e-2  # of the largest reference entry
ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
HANG_S = 300  # each case takes seconds; see the watchdog below


@pytest.fixture(autouse=True)
def interpreter_threads(request):
  """An interpreted case needs 4 or more threads in the CPU client's pool (see
  pallas_mgpu.interpret_params); fewer deadlock it on a small machine, so such a run stops
  here with the fix instead of hanging."""
  if request.node.get_closest_marker("kernel_interpret") is None:
    return
  threads = int(os.environ.get("PJRT_NPROC") or os.cpu_count() or 1)
  if threads < 4:
    pytest.fail(f"{threads} CPU-client threads would deadlock Mosaic GPU's interpreter: run "
                "`make test-kernels`, or set PJRT_NPROC=8 before pytest starts")


@pytest.fixture(autouse=True)
def watchdog():
  """A hang fails loudly instead of holding the suite: past HANG_S the process prints every
  thread's stack and exits (pytest-xdist reports the crashed test and goes on). Mosaic GPU's
  interpreter runs each warpgroup in a thread that blocks on barriers, so a deadlock (in the
  kernel or in the interpreter) would otherwise stall forever."""
  faulthandler.dump_traceback_later(HANG_S, exit=True)
  yield
  faulthandler.cancel_dump_traceback_later()


def check(spec, q, k, v, q_meta, k_meta):
  """The interpreted forward against the reference: outputs on rows that see a key, 0 on
  the others; the logsumexp of the scaled scores, +inf where nothing is visible."""
  out, lse = jax.jit(lambda *a: mgpu_forward(*a[:3], spec, a[3], a[4], interpret=True))(
      q, k, v, q_meta, k_meta)
  f32 = [x.astype(jnp.float32) for x in (q, k, v)]
  ref = np.asarray(reference_attention(*f32, spec, q_meta, k_meta))
  rows = np.asarray(seen(spec, q_meta, k_meta))
  assert out.dtype == q.dtype and out.shape == q.shape
  np.testing.assert_allclose(np.asarray(out, np.float32) * rows, ref * rows, atol=TOL,
                             rtol=TOL)
  np.testing.assert_array_equal(np.asarray(out, np.float32) * (1 - rows), 0.0)
  group = q.shape[2] // k.shape[2]
  kk = jnp.repeat(f32[1], group, axis=2)
  scores = jnp.einsum("bqhd,bkhd->bhqk", f32[0], kk) * q.shape[-1] ** -0.5
  visible = dense_mask(spec, q_meta, k_meta)[:, None]
  want = np.asarray(jax.nn.logsumexp(jnp.where(visible, scores, -jnp.inf), axis=-1))
  got = np.asarray(lse)[:, :, :q.shape[1]]
  hit = np.isfinite(want)
  np.testing.assert_allclose(got[hit], want[hit], atol=TOL, rtol=TOL)
  assert np.isposinf(got[~hit]).all()
  return out, lse


def check_grads(spec, q, k, v, q_meta, k_meta, grads, w):
  """grads (dq, dk, dv) against the reference's for the cotangent w on rows that see a
  key (the reference gives a row that sees nothing the mean of v; the kernels give 0)."""
  f32 = [x.astype(jnp.float32) for x in (q, k, v)]
  _, pull = jax.vjp(lambda q, k, v: reference_attention(q, k, v, spec, q_meta, k_meta), *f32)
  for name, g, r in zip(("dq", "dk", "dv"), grads, pull(w)):
    assert g.dtype == q.dtype and g.shape == r.shape, name
    g, r = np.asarray(g, np.float32), np.asarray(r)
    np.testing.assert_allclose(g, r, atol=GRAD_TOL * np.abs(r).max(), err_msg=name)


def cotangent(spec, w, q_meta, k_meta):
  return (w * seen(spec, q_meta, k_meta)).astype(jnp.bfloat16)


# (spec, data tokens per stream, packed documents, padding tokens, kv heads, GQA ratio, d)
CASES = [(MaskSpec("causal"), 200, 1, 0, 1, 1, 64),
         (MaskSpec("bidirectional"), 100, 3, 4, 1, 1, 64),
         (MaskSpec("dual_stream", 8), 90, 2, 3, 1, 2, 64),
         (MaskSpec("bd3lm", 16), 70, 2, 2, 1, 1, 128),
         (MaskSpec("block_causal", 16), 130, 2, 6, 1, 1, 64)]
# The interpreted cases take minutes on 2 cores: `make test-kernels` runs them (CI too),
# `make test` only the compile check below.
INTERPRETED = pytest.mark.kernel_interpret


@INTERPRETED
@pytest.mark.parametrize("spec,length,docs,padding,kvh,ratio,d", CASES,
                         ids=[c[0].kind for c in CASES])
def test_matches_reference_on_packed_rows(spec, length, docs, padding, kvh, ratio, d):
  """Every mask kind on packed documents with padding, lengths that are not whole tiles
  (the kernels pad to 128 rows), GQA, d 64 and 128: the forward, then the backward on its
  residuals (a separate program, so the forward is not run twice)."""
  meta = packed_meta(spec.kind, length, docs, padding)
  t = meta[0].shape[1]
  q, k, v, w = inputs(jax.random.key(length), 1, t, t, kvh * ratio, kvh, d, jnp.bfloat16)
  out, lse = check(spec, q, k, v, meta, meta)
  d_out = cotangent(spec, w, meta, meta)
  grads = jax.jit(lambda *a: mgpu_backward(*a[:3], spec, meta, meta, *a[3:],
                                           interpret=True))(q, k, v, out, lse, d_out)
  check_grads(spec, q, k, v, meta, meta, grads, d_out.astype(jnp.float32))
  if spec.kind == "causal":  # one document: the walk takes all three kinds of tile
    shares = visit_fractions(tile_classes(spec, meta, meta, 2 * BLOCK_Q, BLOCK_K))
    assert min(shares.values()) > 0, shares


@INTERPRETED
def test_compact_mars_rows_through_attention_impl():
  """MARS's compact noisy stream, as attention_impl=pallas_mgpu runs it: the Hopper forward
  and backward under jax.grad, one program (the custom_vjp). The tables come from the
  metadata, so the same kernels serve it."""
  from cardjax.attention import pallas_gpu as pg

  batch = sft_batch([(0, [[(56, False), (24, True)], [(40, False), (40, True)]])], 160)
  corrupt = compact_corrupt(batch, 8, 0.6)
  spec, meta = corrupt.mask, (corrupt.positions, corrupt.streams, corrupt.segment_ids)
  t = meta[0].shape[1]
  q, k, v, w = inputs(jax.random.key(7), 1, t, t, 2, 1, 64, jnp.bfloat16)
  d_out = cotangent(spec, w, meta, meta)

  def value_and_grads(q, k, v, d_out):
    out, pull = jax.vjp(lambda q, k, v: pg.pallas_gpu_attention(
        q, k, v, spec, meta, meta, interpret=True, forward="mosaic"), q, k, v)
    return out, pull(d_out)

  out, grads = jax.jit(value_and_grads)(q, k, v, d_out)
  rows = np.asarray(seen(spec, meta, meta))
  ref = reference_attention(*(x.astype(jnp.float32) for x in (q, k, v)), spec, meta, meta)
  np.testing.assert_allclose(np.asarray(out, np.float32) * rows, np.asarray(ref) * rows,
                             atol=TOL, rtol=TOL)
  check_grads(spec, q, k, v, meta, meta, grads, d_out.astype(jnp.float32))


@INTERPRETED
def test_rows_with_no_visible_key_give_zeros():
  """Cross attention where half the queries' segment has no key: 0 and lse +inf there,
  and zero gradient from those rows."""
  tq, tk = 96, 160
  q_meta = (jnp.arange(tq, dtype=jnp.int32)[None] + 64, jnp.zeros((1, tq), jnp.int32),
            jnp.asarray([[1] * 48 + [2] * 48], jnp.int32))
  k_meta = (jnp.arange(tk, dtype=jnp.int32)[None], jnp.zeros((1, tk), jnp.int32),
            jnp.ones((1, tk), jnp.int32))
  q, k, v, w = inputs(jax.random.key(4), 1, tq, tk, 1, 1, 64, jnp.bfloat16)
  spec = MaskSpec("causal")
  out, lse = check(spec, q, k, v, q_meta, k_meta)
  d_out = cotangent(spec, w, q_meta, k_meta)
  grads = jax.jit(lambda *a: mgpu_backward(*a[:3], spec, q_meta, k_meta, *a[3:],
                                           interpret=True))(q, k, v, out, lse, d_out)
  check_grads(spec, q, k, v, q_meta, k_meta, grads, d_out.astype(jnp.float32))
  np.testing.assert_array_equal(np.asarray(grads[0], np.float32)[:, 48:], 0.0)


@INTERPRETED
def test_the_triton_backward_takes_its_residuals():
  """forward="mosaic", backward="triton": pallas_gpu's dq and dk/dv kernels on this
  forward's (out, logsumexp) give the reference's gradients, so either backward can follow
  either forward."""
  from cardjax.attention import pallas_gpu as pg
  from cardjax.attention.pallas_gpu_bwd import backward

  spec = MaskSpec("dual_stream", 8)
  meta = packed_meta("dual_stream", 60, 2, 3)
  t = meta[0].shape[1]
  q, k, v, w = inputs(jax.random.key(9), 1, t, t, 2, 1, 64, jnp.bfloat16)
  d_out = cotangent(spec, w, meta, meta)
  out, lse = jax.jit(lambda q, k, v: mgpu_forward(q, k, v, spec, meta, meta,
                                                  interpret=True))(q, k, v)
  cfg = pg.Config(spec=spec, interpret=True, block_q=64, block_k=64, bwd_block_q=32,
                  bwd_block_k=32, forward="mosaic", backward="triton")
  classes = pg.tile_classes(spec, meta, meta, 32, 32)
  tables = (None, pg.visit_table(classes), pg.visit_table(jnp.swapaxes(classes, 1, 2)))
  grads = backward(cfg, q, k, v, meta, meta, tables, out, lse, d_out)
  check_grads(spec, q, k, v, meta, meta, grads, d_out.astype(jnp.float32))


def test_unsupported_reason():
  spec = MaskSpec("causal")
  assert unsupported_reason(spec, 128, 128, 128, jnp.bfloat16) is None
  assert "head_dim 32" in unsupported_reason(spec, 128, 128, 32, jnp.bfloat16)
  assert "float32" in unsupported_reason(spec, 128, 128, 64, jnp.float32)
  with pytest.raises(ValueError, match="head_dim 96"):
    mgpu_forward(*(jnp.zeros((1, 128, 1, 96), jnp.bfloat16),) * 3, spec,
                 (jnp.zeros((1, 128), jnp.int32),) * 3, (jnp.zeros((1, 128), jnp.int32),) * 3)


COMPILE = """
import json
from benchmarks.gpu_kernels import _start_worker
_start_worker(trace_check=False)
import jax, jax.numpy as jnp
from jax.sharding import NamedSharding, PartitionSpec
from cardjax.attention import MaskSpec
from cardjax.attention.pallas_gpu import pallas_gpu_attention
from cardjax.attention.pallas_mgpu import mgpu_forward
from cardjax.plan.targets import gpu_devices

sharding = NamedSharding(jax.sharding.Mesh(gpu_devices("H100", "1x1x1"), ("x",)),
                         PartitionSpec())
out = {}
for kind, block, d in (("causal", 0, 128), ("bidirectional", 0, 64), ("dual_stream", 16, 128),
                       ("bd3lm", 16, 64), ("block_causal", 16, 128)):
  spec = MaskSpec(kind, block_size=block)
  q = jax.ShapeDtypeStruct((2, 1000, 8, d), jnp.bfloat16, sharding=sharding)
  k = jax.ShapeDtypeStruct((2, 1000, 2, d), jnp.bfloat16, sharding=sharding)
  m = jax.ShapeDtypeStruct((2, 1000), jnp.int32, sharding=sharding)
  fn = lambda q, k, v, a, b, c: mgpu_forward(q, k, v, spec, (a, b, c), (a, b, c),
                                             interpret=False)
  lowered = jax.jit(fn).lower(q, k, k, m, m, m)
  compiled = lowered.compile()
  # The backward as training runs it: attention_impl=pallas_mgpu under jax.grad.
  loss = lambda q, k, v, a, b, c: pallas_gpu_attention(
      q, k, v, spec, (a, b, c), (a, b, c), interpret=False, forward="mosaic").sum()
  grad = jax.jit(jax.grad(loss, argnums=(0, 1, 2))).lower(q, k, k, m, m, m)
  grad.compile()
  out[kind] = {"mosaic": "mosaic_gpu" in lowered.as_text(),
               "flops": (compiled.cost_analysis() or {}).get("flops"),
               "grad_kernels": grad.as_text().count("mosaic_gpu")}
print("RESULT " + json.dumps(out))
"""


@pytest.mark.integration  # 50 s on 2 cores: every mask kind compiled for H100 by XLA:GPU
@pytest.mark.skipif(not gpu_plugin_in_plan_dir(),
                    reason=f"no jax_cuda12_plugin in {GPU_PLAN_DIR} (`make install-gpu-plan`)")
def test_every_mask_kind_compiles_for_h100_without_a_gpu():
  """The compiled variants (probabilities and ds from registers, tiles by TMA, wgmma) of
  the forward and of the training step's gradient (forward, dq and dk/dv kernels) lower
  through Mosaic GPU for sm_90 within its shared memory, and XLA:GPU compiles the
  programs around them."""
  env = dict(os.environ, PYTHONPATH=ROOT)
  run = subprocess.run([sys.executable, "-c", COMPILE], cwd=ROOT, env=env,
                       capture_output=True, text=True, timeout=300)
  lines = [x for x in run.stdout.splitlines() if x.startswith("RESULT ")]
  assert run.returncode == 0 and lines, run.stderr[-3000:]
  result = json.loads(lines[-1][len("RESULT "):])
  assert set(result) == {"causal", "bidirectional", "dual_stream", "bd3lm", "block_causal"}
  assert all(r["mosaic"] for r in result.values()), result
  assert all(r["grad_kernels"] >= 3 for r in result.values()), result
