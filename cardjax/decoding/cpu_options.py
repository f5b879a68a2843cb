"""XLA compiler options for the decode loops on CPU.

XLA's CPU backend hands dots with more than one row to YNNPACK by default (jax 0.10) and
keeps its Eigen kernels for matrix-vector products. For the skinny matmuls of decoding
([1..16 rows] x [576 x 1536] on SmolLM2-135M) the YNNPACK path is the slower one: measured
on 2 AMD EPYC cores (benchmarks/decode_forward.py --model), a cached forward of SmolLM2 with
8 new tokens took 108 ms with it and 66 ms without, one new token 48 ms and 37 ms (the
attention's small dots were YNNPACK too). Training's matmuls ([1024 rows] x ...) run at the
same speed either way, so only the decode loops set it.

Set CARDJAX_CPU_YNN_DOTS=1 to keep XLA's default. On other backends, or on a jaxlib that
does not know the option, no option is set.
"""

from __future__ import annotations

import functools
import os

import jax
import jax.numpy as jnp

YNN_OPTION = "xla_cpu_experimental_ynn_fusion_type"


@functools.cache
def decode_compiler_options() -> dict | None:
  """compiler_options for jax.jit of a decode loop: YNNPACK dots off on CPU, else None."""
  if os.environ.get("CARDJAX_CPU_YNN_DOTS", "0") not in ("", "0"):
    return None
  if jax.default_backend() != "cpu":
    return None
  options = {YNN_OPTION: ""}
  try:  # a jaxlib that dropped the option rejects it at compile time: probe once
    jax.jit(lambda x: x @ x, compiler_options=options).lower(jnp.ones((2, 2))).compile()
  except Exception:  # noqa: BLE001 - any rejection means "leave XLA's default"
    return None
  return options


def jit(fn, **kwargs):
  """jax.jit with the decode compiler options. Call it when the loop is first needed, not
  at import: deciding initialises jax's backend."""
  return jax.jit(fn, compiler_options=decode_compiler_options(), **kwargs)
