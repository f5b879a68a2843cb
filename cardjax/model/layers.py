"""Small building blocks: RMSNorm, the SwiGLU MLP, and a parameter helper.

Every parameter carries `logical_axes` metadata, read by cardjax.parallel.sharding.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
from flax import nnx

from cardjax.model import lora as lora_lib
from cardjax.model.config import ModelConfig
from cardjax.parallel.sharding import constrain


def param(rngs: nnx.Rngs | None, shape, axes, dtype, init: str = "normal", scale: float = 0.02):
  """An nnx.Param with logical axis names; init is 'normal', 'zeros' or 'ones'."""
  if init == "normal":
    value = scale * jax.random.normal(rngs.params(), shape, dtype)
  elif init == "zeros":
    value = jnp.zeros(shape, dtype)
  else:
    value = jnp.ones(shape, dtype)
  return nnx.Param(value, logical_axes=tuple(axes))


def rms_norm(x, scale, eps: float):
  """RMSNorm over the last axis: normalise in float32, then scale in x's dtype (as the HF
  reference does)."""
  xf = x.astype(jnp.float32)
  xf = xf * jax.lax.rsqrt(jnp.mean(xf * xf, axis=-1, keepdims=True) + eps)
  return scale.astype(x.dtype) * xf.astype(x.dtype)


class RMSNorm(nnx.Module):
  def __init__(self, cfg: ModelConfig, rngs: nnx.Rngs):
    self.eps = cfg.rms_norm_eps
    self.scale = param(rngs, (cfg.hidden_size,), ("embed",), jnp.dtype(cfg.param_dtype), "ones")

  def __call__(self, x):
    return rms_norm(x, self.scale[...], self.eps)


class MLP(nnx.Module):
  """SwiGLU: down(silu(gate(x)) * up(x))."""

  def __init__(self, cfg: ModelConfig, rngs: nnx.Rngs, lora: lora_lib.LoraSpec | None = None):
    d, f = cfg.hidden_size, cfg.intermediate_size
    pd, s = jnp.dtype(cfg.param_dtype), cfg.initializer_range
    self.dtype = jnp.dtype(cfg.dtype)
    self.gate = param(rngs, (d, f), ("embed", "mlp"), pd, scale=s)
    self.up = param(rngs, (d, f), ("embed", "mlp"), pd, scale=s)
    self.down = param(rngs, (f, d), ("mlp", "embed"), pd, scale=s)
    self.bias = cfg.mlp_bias
    if cfg.mlp_bias:
      self.gate_bias = param(rngs, (f,), ("mlp",), pd, "zeros")
      self.up_bias = param(rngs, (f,), ("mlp",), pd, "zeros")
      self.down_bias = param(rngs, (d,), ("embed",), pd, "zeros")
    self.gate_lora = lora_lib.adapter(lora, "gate", d, f, cfg, rngs, in_axis="embed")
    self.up_lora = lora_lib.adapter(lora, "up", d, f, cfg, rngs, in_axis="embed")
    self.down_lora = lora_lib.adapter(lora, "down", f, d, cfg, rngs, out_axis="embed")

  def __call__(self, x, drop_keys=None):
    """drop_keys: per-row keys for LoRA dropout (training only; None otherwise)."""
    dt = self.dtype
    gate = x @ self.gate[...].astype(dt)
    up = x @ self.up[...].astype(dt)
    if self.gate_lora is not None:
      gate = gate + self.gate_lora(x, drop_keys)
    if self.up_lora is not None:
      up = up + self.up_lora(x, drop_keys)
    if self.bias:
      gate = gate + self.gate_bias[...].astype(dt)
      up = up + self.up_bias[...].astype(dt)
    h = constrain(jax.nn.silu(gate) * up, ("act_batch", "act_seq", "act_mlp"))
    out = h @ self.down[...].astype(dt)
    if self.down_lora is not None:
      out = out + self.down_lora(h, drop_keys)
    if self.bias:
      out = out + self.down_bias[...].astype(dt)
    return out
