"""AdamW with warmup + cosine / constant / WSD schedules, clipping, and no weight decay on
norms and biases; its state sharded like the parameters."""

from __future__ import annotations

import jax
import optax
from flax import nnx
from jax.sharding import NamedSharding, PartitionSpec

from cardjax.errors import ConfigError

SCHEDULES = ("cosine", "constant", "wsd")


def warmup_steps(train) -> int:
  if train.warmup_steps:
    return int(train.warmup_steps)
  return int(round(train.warmup_fraction * train.steps))


def learning_rate(train) -> optax.Schedule:
  """Linear warmup, then cosine to min_lr_ratio * lr, constant, or warmup-stable-decay."""
  peak, total = train.lr, train.steps
  warm = warmup_steps(train)
  low = peak * train.min_lr_ratio
  if train.schedule == "cosine":
    return optax.warmup_cosine_decay_schedule(0.0, peak, warm, max(total, warm + 1), low)
  if train.schedule == "constant":
    return optax.join_schedules([optax.linear_schedule(0.0, peak, warm),
                                 optax.constant_schedule(peak)], [warm])
  if train.schedule == "wsd":
    decay = max(1, int(round(train.decay_fraction * total)))
    stable = max(0, total - warm - decay)
    return optax.join_schedules([optax.linear_schedule(0.0, peak, warm),
                                 optax.constant_schedule(peak),
                                 optax.linear_schedule(peak, low, decay)],
                                [warm, warm + stable])
  raise ConfigError(f"train.schedule={train.schedule!r}; choose one of {SCHEDULES}")


def decay_mask(params: nnx.State):
  """True for parameters that take weight decay: matrices, not norm scales or biases."""
  def decays(path, _):
    names = [str(getattr(k, "key", getattr(k, "name", k))) for k in path]
    return not any("norm" in n or "bias" in n for n in names)

  return jax.tree_util.tree_map_with_path(decays, params)


def make_optimizer(train, params: nnx.State) -> optax.GradientTransformation:
  return optax.chain(
      optax.clip_by_global_norm(train.grad_clip) if train.grad_clip > 0 else optax.identity(),
      optax.adamw(learning_rate(train), b1=train.b1, b2=train.b2, eps=train.eps,
                  weight_decay=train.weight_decay, mask=decay_mask(params)))


def state_shardings(tx: optax.GradientTransformation, params, mesh):
  """The shardings of tx's state for `params` (arrays or ShapeDtypeStructs with shardings):
  every per-parameter leaf (AdamW's mu and nu) takes its parameter's sharding, so the
  moments shard over fsdp and tensor like the weights (ZeRO-3), and the rest (step counts)
  is replicated. optax.tree_map_params finds the per-parameter trees of the chain; inside
  optax.masked (or multi_transform) pieces with state, a masked-out parameter's leaf is a
  MaskedNode and stays one. tree_map_params runs tx.init eagerly on placeholders (AdamW's
  step count): call this outside `jax.set_mesh` of a compile-only mesh (cardjax plan does)."""
  def like_param(leaf, param):
    return leaf if isinstance(leaf, optax.MaskedNode) else param.sharding

  return optax.tree_map_params(
      tx, like_param, jax.eval_shape(tx.init, params), params,
      transform_non_params=lambda _: NamedSharding(mesh, PartitionSpec()),
      is_leaf=lambda leaf: isinstance(leaf, optax.MaskedNode))


def sharded_init(tx: optax.GradientTransformation, params, mesh):
  """tx.init jitted to give its state `state_shardings`. Without out_shardings jit returns
  the zero moments replicated: every device would hold all of them (57 GiB at 7B)."""
  return jax.jit(tx.init, out_shardings=state_shardings(tx, params, mesh))
