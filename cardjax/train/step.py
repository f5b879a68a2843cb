"""The train and eval steps: pure functions of (params, opt_state, batch, step), jitted once
with explicit shardings and donation by the loop.

Corruption is keyed per example: row r of step s uses fold_in(fold_in(seed, s), r), so a
resumed run, a different mesh, or k accumulation micro-batches of b rows all draw exactly
the masks one step of k*b rows draws. Micro-batch losses are weighted by their objective's
normalizer (tokens or rows), so accumulation equals the large batch instead of averaging
means (and never rescales the loss twice).

`params` are what the step trains and the optimizer holds; `frozen` the rest of the model,
read but never differentiated or updated: the base weights under LoRA (the adapters are the
params), an empty dict otherwise. The graphdef comes from
`nnx.split(model, trainable, nnx.Param)`.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
import optax
from flax import nnx

from cardjax.data.pipeline import KEYS as BATCH_KEYS
from cardjax.objectives.base import ModelInputs, Objective
from cardjax.objectives.chunked_ce import HeadInputs


def corrupt_rows(objective: Objective, batch: dict, keys: jax.Array,
                 strata: jax.Array | None = None) -> ModelInputs:
  """objective.corrupt on each row with its own key (vmapped), as one batch again. With
  `strata` ([rows] in [0, 1), step_strata), each row also gets its own `stratum`, which an
  objective with a low-discrepancy t draw reads instead of a uniform of its key."""
  def one(row, key):
    out = objective.corrupt({k: v[None] for k, v in row.items()}, key)
    return jax.tree.map(lambda x: x[0], out)

  if strata is not None:
    batch = dict(batch, stratum=strata)
  return jax.vmap(one)(batch, keys)


def step_row_keys(seed_key: jax.Array, step, rows: int) -> jax.Array:
  """One key per row of a step's global batch: fold_in(fold_in(seed, step), row)."""
  step_key = jax.random.fold_in(seed_key, step)
  return jax.vmap(lambda r: jax.random.fold_in(step_key, r))(jnp.arange(rows))


# The stream the strata's offsets come from: one fold_in of the seed no step reaches.
_STRATA_STREAM = 2**31 - 2


def step_strata(seed_key: jax.Array, step, rows: int) -> jax.Array:
  """frac(u + r / rows) for each global row r, u ~ U(0, 1) once per step: every row is still
  uniform, but the step's rows cover [0, 1) evenly (the MDLM paper's low-discrepancy
  sampler, which lowers the variance of the loss over t). Indexed by the global row, so a
  mesh or accumulation split draws the same strata as one large batch."""
  offset_key = jax.random.fold_in(jax.random.fold_in(seed_key, _STRATA_STREAM), step)
  u = jax.random.uniform(offset_key, ())
  return jnp.mod(u + jnp.arange(rows, dtype=jnp.float32) / rows, 1.0)


def forward(graphdef, params, inputs: ModelInputs, loss_chunk: int = 0, frozen=None,
            drop_keys=None):
  """The logits of `inputs`; with loss_chunk > 0 a HeadInputs instead (features and head),
  whose cross-entropy is taken loss_chunk positions at a time (objectives.chunked_ce).
  drop_keys: the rows' keys, for LoRA dropout where the model has it (training)."""
  model = nnx.merge(graphdef, params, {} if frozen is None else frozen)
  if model.lora is None or not model.lora.dropout:
    drop_keys = None
  args = dict(positions=inputs.positions, segment_ids=inputs.segment_ids, mask=inputs.mask,
              streams=inputs.streams, drop_keys=drop_keys)
  if loss_chunk:
    return HeadInputs(model.features(inputs.tokens, **args), model.head_matrix(), loss_chunk)
  return model(inputs.tokens, **args)


def make_train_step(graphdef, objective: Objective, tx: optax.GradientTransformation,
                    seed: int, accum: int, loss_chunk: int = 0):
  def micro_loss(params, frozen, micro, keys, strata):
    inputs = corrupt_rows(objective, micro, keys, strata)
    loss, metrics = objective.loss(forward(graphdef, params, inputs, loss_chunk, frozen, keys),
                                   inputs)
    n = jax.lax.stop_gradient(objective.normalizer(inputs))
    return loss * n, (n, metrics)

  grad_fn = jax.value_and_grad(micro_loss, has_aux=True)

  def step_fn(params, opt_state, batch, step, frozen=None):
    # The key is made inside the trace: an eager key would be a constant committed to the
    # default device, which a compile-only mesh (cardjax plan) cannot take.
    seed_key = jax.random.key(seed)
    frozen = {} if frozen is None else frozen
    rows = batch["tokens"].shape[0]
    if rows % accum:
      raise ValueError(f"batch of {rows} rows does not split into {accum} micro-batches")
    size = rows // accum

    def split(x):
      # Micro-batch j takes rows j, j + accum, j + 2 accum, ...: every device keeps its own
      # rows, a share of each micro-batch, and the scanned axis stays unsharded. Contiguous
      # micro-batches (rows [j size, (j + 1) size)) would put each one on a subset of the
      # devices, a layout that needs resharding and that custom-partitioned ops (cuDNN
      # attention) cannot express: jax's custom_partitioner failed on it for accum >= 2 on
      # 8 GPUs. Row keys follow the rows, so the step is the same for any split.
      return x.reshape((size, accum) + x.shape[1:]).swapaxes(0, 1)

    micro = jax.tree.map(split, batch)
    keys = split(step_row_keys(seed_key, step, rows))
    strata = split(step_strata(seed_key, step, rows))

    def body(carry, xs):
      grads, total, norm, metrics = carry
      (weighted, (n, m)), g = grad_fn(params, frozen, *xs)
      metrics = jax.tree.map(lambda a, b: a + b * n, metrics, m)
      return (jax.tree.map(jnp.add, grads, g), total + weighted, norm + n, metrics), None

    if accum == 1:
      (weighted, (n, m)), g = grad_fn(params, frozen, jax.tree.map(lambda x: x[0], micro),
                                      keys[0], strata[0])
      carry = (g, weighted, n, jax.tree.map(lambda b: b * n, m))
    else:
      # Every micro-batch inside the scan, from a zero carry: with the first one outside
      # (to learn the metrics' shapes) XLA kept its activations live beside the scan's,
      # so accum 2 needed about twice accum 1's temp memory instead of about half.
      shapes = jax.eval_shape(grad_fn, params, frozen, jax.tree.map(lambda x: x[0], micro),
                              keys[0], strata[0])
      (weighted, (n, m)), g = jax.tree.map(lambda a: jnp.zeros(a.shape, a.dtype), shapes)
      carry, _ = jax.lax.scan(body, (g, weighted, n, m), (micro, keys, strata))
    grads, total, norm, metrics = carry
    norm = jnp.maximum(norm, 1e-9)
    grads = jax.tree.map(lambda g: g / norm, grads)
    metrics = jax.tree.map(lambda v: v / norm, metrics)
    updates, opt_state = tx.update(grads, opt_state, params)
    params = optax.apply_updates(params, updates)
    metrics = dict(metrics, loss=total / norm, grad_norm=optax.tree.norm(grads))
    return params, opt_state, metrics

  return step_fn


def jit_train_step(graphdef, objective: Objective, tx: optax.GradientTransformation, train,
                   seed: int, param_sh, opt_sh, batch_sh, frozen_sh=None):
  """The train step as the trainer runs it (and `cardjax plan` compiles it): jitted with
  the parameters' and optimizer state's shardings in and out, the batch rows over the
  data-parallel axes, parameters and state donated (the frozen weights are read only).
  Called as step(params, opt_state, batch, step, frozen)."""
  batch_shardings = {k: batch_sh for k in BATCH_KEYS}
  return jax.jit(make_train_step(graphdef, objective, tx, seed, train.grad_accum,
                                 train.loss_chunk),
                 in_shardings=(param_sh, opt_sh, batch_shardings, None,
                               {} if frozen_sh is None else frozen_sh),
                 out_shardings=(param_sh, opt_sh, None), donate_argnums=(0, 1))


def make_eval_step(graphdef, objective: Objective, seed: int, loss_chunk: int = 0):
  """Objective loss (fixed corruption per eval row) and the plain AR NLL of the clean text."""
  def eval_fn(params, batch, index, frozen=None):
    eval_key = jax.random.fold_in(jax.random.key(seed), 2**31 - 1)  # never a train step
    rows = batch["tokens"].shape[0]
    inputs = corrupt_rows(objective, batch, step_row_keys(eval_key, index, rows),
                          step_strata(eval_key, index, rows))
    loss, metrics = objective.loss(forward(graphdef, params, inputs, loss_chunk, frozen),
                                   inputs)
    model = nnx.merge(graphdef, params, {} if frozen is None else frozen)
    nll = objective.ar_nll(lambda t, p, s: model(t, positions=p, segment_ids=s), batch)
    return dict(metrics, loss=loss, ar_nll=nll)

  return eval_fn
