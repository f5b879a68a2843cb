"""Packed conversation rows and MARS's compact corrupt of them, shared by the compact noisy
stream's tests (the objective, the Pallas GPU kernel and splash)."""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np

from objectives_helpers import MASK, objective

# Interpret-mode kernels compile large programs: optimisation buys the tests nothing.
FAST_COMPILE = {"xla_backend_optimization_level": 0, "xla_llvm_disable_expensive_passes": True}


def sft_batch(rows, length: int, seed: int = 0, block: int = 0) -> dict:
  """A data batch of `rows`, each (padding before, documents), a document a list of
  (tokens, carries loss) spans; positions restart at 0 per document, tokens are random.
  block > 0: splash's layout contract is asserted too (the leading padding and every
  document a whole number of blocks, as the SFT pipeline pads them)."""
  out = {k: np.zeros((len(rows), length), np.int32)
         for k in ("tokens", "positions", "segment_ids", "loss_mask")}
  out["tokens"][:] = np.random.default_rng(seed).integers(1, MASK, out["tokens"].shape)
  for r, (lead, docs) in enumerate(rows):
    assert not block or lead % block == 0
    i = lead
    for s, spans in enumerate(docs):
      start = i
      for n, carries in spans:
        out["segment_ids"][r, i:i + n] = s + 1
        out["loss_mask"][r, i:i + n] = int(carries)
        i += n
      assert not block or (i - start) % block == 0
      out["positions"][r, start:i] = np.arange(i - start)
    assert i <= length
  return {k: jnp.asarray(v) for k, v in out.items()}


def compact_corrupt(batch: dict, block: int, fraction: float):
  """MARS's compact corrupt of `batch` (its ModelInputs), every row fitting its stream."""
  inputs = jax.jit(objective("mars", block_size=block, noisy_fraction=fraction).corrupt)(
      batch, jax.random.key(0))
  assert inputs.mask.compact and not np.asarray(inputs.aux["noisy_overflow"]).any()
  return inputs


def out_and_grads(fn, spec):
  """jit((q, k, v, w, meta) -> (out, (dq, dk, dv))) of the loss sum(out * w) through the
  attention `fn(q, k, v, spec, q_meta, k_meta)`."""
  def loss(q, k, v, w, meta):
    out = fn(q, k, v, spec, meta, meta)
    return jnp.sum(out * w), out

  grad = jax.grad(loss, argnums=(0, 1, 2), has_aux=True)
  return jax.jit(lambda *a: grad(*a)[::-1], compiler_options=FAST_COMPILE)
