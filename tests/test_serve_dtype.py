"""`cardjax serve --dtype`: bfloat16 on accelerators by default (half the bytes a decoding
forward reads), float32 on a CPU, either on request."""

import jax
import jax.numpy as jnp
from flax import nnx
from serve_helpers import mars_run, post, start_server

from cardjax.restore import load_run
from cardjax.serve.cli import served_dtype


def test_auto_is_bfloat16_on_accelerators_and_float32_on_a_cpu():
  assert served_dtype("auto", "gpu") == served_dtype("auto", "tpu") == "bfloat16"
  assert served_dtype("auto", "cpu") == "float32"
  assert served_dtype("float32", "gpu") == "float32"


def test_a_run_loads_in_bfloat16_weights_and_compute(tmp_path):
  run = load_run(mars_run(tmp_path, context=64), dtype="bfloat16")
  params = jax.tree.leaves(nnx.state(run.model, nnx.Param))
  assert params and all(p.dtype == jnp.bfloat16 for p in params)
  assert run.model.cfg.dtype == run.model.cfg.param_dtype == "bfloat16"
  logits = run.model(jnp.asarray([[5, 6, 7]]))
  assert logits.dtype == jnp.bfloat16 and bool(jnp.isfinite(logits).all())


def test_a_bfloat16_server_answers(tmp_path):
  proc, url = start_server(mars_run(tmp_path, context=64), "--dtype", "bfloat16",
                           "--batch-sizes", "1", "--chunk", "2", "--slots", "64")
  try:
    status, answer, _ = post(url, {"model": "run", "prompt": "alpha beta", "max_tokens": 4,
                                   "ignore_eos": True})
    assert status == 200 and answer["usage"]["completion_tokens"] == 4
  finally:
    proc.kill()
    output = proc.stdout.read()
    proc.wait()
  assert ", bfloat16, batch sizes" in output
